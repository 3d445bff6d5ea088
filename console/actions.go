package console

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/endpoints"
)

// defaultSnooze is how long a snooze delays a job unless the form says.
const defaultSnooze = time.Hour

func contextTimeout(r *http.Request, s *Server) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), cmp.Or(s.cfg.Timeout, 10*time.Second))
}

// jobAction is one of the actions on jobs: what it does to a batch of ids,
// and the words that report it.
type jobAction struct {
	do      func(ctx context.Context, a *admin.Admin, ids []int64, snooze time.Duration) ([]admin.Change, error)
	did     string
	applies string
}

var jobActions = map[string]jobAction{
	"retry": {func(ctx context.Context, a *admin.Admin, ids []int64, _ time.Duration) ([]admin.Change, error) {
		return a.Retry(ctx, ids)
	}, "retried", "dead or cancelled"},
	"cancel": {func(ctx context.Context, a *admin.Admin, ids []int64, _ time.Duration) ([]admin.Change, error) {
		return a.Cancel(ctx, ids)
	}, "cancelled", "pending or running"},
	"snooze": {func(ctx context.Context, a *admin.Admin, ids []int64, d time.Duration) ([]admin.Change, error) {
		return a.Snooze(ctx, ids, d)
	}, "snoozed", "pending"},
	"delete": {func(ctx context.Context, a *admin.Admin, ids []int64, _ time.Duration) ([]admin.Change, error) {
		return a.Delete(ctx, ids)
	}, "deleted", "not running"},
}

// back is where an action returns to: the form's page, on this console.
func back(r *http.Request, def string) string {
	b := r.PostFormValue("back")
	if !strings.HasPrefix(b, "/") || strings.HasPrefix(b, "//") || strings.HasPrefix(b, "/\\") {
		return def
	}
	return b
}

// redirect returns to to with msg shown on the page, signed so that a link
// from elsewhere cannot put words on the console's pages.
func (s *Server) redirect(w http.ResponseWriter, r *http.Request, to, msg string) {
	u, err := url.Parse(to)
	if err != nil {
		u = &url.URL{Path: "/"}
	}
	q := u.Query()
	q.Set("msg", msg)
	q.Set("sig", s.sign(msg))
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
}

func parseSnooze(r *http.Request) (time.Duration, error) {
	v := r.PostFormValue("for")
	if v == "" {
		return defaultSnooze, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("snooze for %q: want a duration such as 90s or 2h", v)
	}
	return d, nil
}

// jobsAction applies an action to the jobs the form names.
func (s *Server) jobsAction(w http.ResponseWriter, r *http.Request) {
	to := back(r, "/jobs")
	name := r.PostFormValue("action")
	act, ok := jobActions[name]
	if !ok {
		http.Error(w, fmt.Sprintf("unknown action %q", name), http.StatusBadRequest)
		return
	}
	var ids []int64
	for _, v := range r.PostForm["id"] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			http.Error(w, fmt.Sprintf("not a job id: %q", v), http.StatusBadRequest)
			return
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		s.redirect(w, r, to, "select jobs first")
		return
	}
	d, err := parseSnooze(r)
	if err != nil {
		s.redirect(w, r, to, err.Error())
		return
	}
	if name == "delete" && !confirmed(r) {
		fields := []field{{"action", name}, {"back", to}}
		for _, id := range ids {
			fields = append(fields, field{"id", strconv.FormatInt(id, 10)})
		}
		s.confirm(w, r, "jobs", confirmView{
			Question: fmt.Sprintf("Delete %d %s?", len(ids), plural(len(ids), "job")),
			What: "Each one's row goes, with its errors and its result, and cannot be brought back. " +
				"A job that is running is left as it is.",
			List: "Jobs " + idList(ids) + ".",
			Form: "/actions/jobs", Fields: fields, Yes: map[bool]string{true: "Yes, delete it", false: "Yes, delete them"}[len(ids) == 1], Back: to,
		})
		return
	}
	// An action runs to its end when the browser leaves; each statement
	// has its timeout.
	ctx := context.WithoutCancel(r.Context())
	changes, err := act.do(ctx, s.admin, ids, d)
	s.hub.poke()
	changed, left := 0, 0
	for _, c := range changes {
		if c.Changed {
			changed++
		} else {
			left++
		}
	}
	s.log.Info("console action", zap.String("who", userOf(r).Name), zap.String("action", name),
		zap.Int64s("job_ids", ids), zap.Int("changed", changed), zap.Error(err))
	msg := summary(act, changed, left)
	if err != nil {
		msg = s.dbError(name+" jobs", err)
	}
	if name == "delete" && changed > 0 && strings.HasPrefix(to, "/jobs/") {
		to = "/jobs" // the job's own page is gone
	}
	s.redirect(w, r, to, msg)
}

// confirmView asks to confirm an action that cannot be undone: the form
// posts it again, with confirmed set.
type confirmView struct {
	Question, What, List string
	Form                 string // where the form posts
	Fields               []field
	Yes, Back            string
}

type field struct{ Name, Value string }

// confirmed reports whether the form is a confirmation's (confirmView).
func confirmed(r *http.Request) bool { return r.PostFormValue("confirmed") == "yes" }

// confirm shows v: the question of an action not taken yet.
func (s *Server) confirm(w http.ResponseWriter, r *http.Request, nav string, v confirmView) {
	s.render(w, r, "confirm", "layout.html", page{Title: "Confirm", Nav: nav, Data: v})
}

// idList writes ids for a confirmation, the first 20 of them.
func idList(ids []int64) string {
	const most = 20
	var b strings.Builder
	for i, id := range ids[:min(len(ids), most)] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	if len(ids) > most {
		fmt.Fprintf(&b, " and %d more", len(ids)-most)
	}
	return b.String()
}

func summary(act jobAction, changed, left int) string {
	msg := fmt.Sprintf("%s %d %s", act.did, changed, plural(changed, "job"))
	if left > 0 {
		msg += fmt.Sprintf("; %d left as they were (not %s, or gone)", left, act.applies)
	}
	return msg
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// sameOrigin reports whether a GET came from the console's own pages, or
// was typed or bookmarked (Sec-Fetch-Site same-origin or none; a client
// that does not send the header is not a browser on another site's page).
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return true
	}
	return false
}

// bulkFilter reads the filter of an action on every job it selects: the
// jobs page's, without its cursor.
func bulkFilter(q url.Values, u user) (admin.JobFilter, error) {
	f, err := parseFilter(q, u)
	f.After, f.Limit = nil, 0
	return f, err
}

// bulkView is the confirmation of an action on every job a filter selects.
type bulkView struct {
	Action string
	// Filter is the filter as a query string, Words as a sentence.
	Filter, Words string
	// Count and MaxID are the jobs the filter selected when counted and
	// the highest id among them, which bounds the action.
	Count, MaxID int64
	Back         string
}

// bulkConfirm shows which jobs the filter selects, in words, and how many,
// and asks to confirm the action on all of them.
func (s *Server) bulkConfirm(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		http.Error(w, "refused: an action on every job a filter selects is confirmed from the console's own jobs page", http.StatusForbidden)
		return
	}
	q := r.URL.Query()
	name := q.Get("action")
	if _, ok := jobActions[name]; !ok {
		http.Error(w, fmt.Sprintf("unknown action %q", name), http.StatusBadRequest)
		return
	}
	p := page{Title: "Confirm: " + name, Nav: "jobs"}
	filter := without(q, map[string]bool{"action": true, "msg": true, "sig": true})
	v := bulkView{Action: name, Filter: filter.Encode(), Back: "/jobs?" + filter.Encode()}
	f, err := bulkFilter(filter, userOf(r))
	if err != nil {
		p.Error = err.Error()
	} else if v.Count, v.MaxID, err = s.admin.Count(r.Context(), f); err != nil {
		p.Error = s.dbError("count the jobs", err)
	}
	v.Words = describe(f)
	p.Data = v
	s.render(w, r, "bulk", "layout.html", p)
}

// bulkAction applies an action to every job the filter selects, up to the
// highest id counted, in batches in id order. When more jobs would change
// than the confirmation showed, it asks again.
func (s *Server) bulkAction(w http.ResponseWriter, r *http.Request) {
	name := r.PostFormValue("action")
	act, ok := jobActions[name]
	if !ok {
		http.Error(w, fmt.Sprintf("unknown action %q", name), http.StatusBadRequest)
		return
	}
	filter, err := url.ParseQuery(r.PostFormValue("filter"))
	to := "/jobs?" + filter.Encode()
	if err != nil {
		http.Error(w, "the filter is not a query string", http.StatusBadRequest)
		return
	}
	shown, err1 := strconv.ParseInt(r.PostFormValue("count"), 10, 64)
	maxID, err2 := strconv.ParseInt(r.PostFormValue("max"), 10, 64)
	if err1 != nil || err2 != nil || shown < 0 || maxID < 0 {
		http.Error(w, "the form lacks the count it confirms: reload the confirmation", http.StatusBadRequest)
		return
	}
	f, err := bulkFilter(filter, userOf(r))
	if err != nil {
		s.redirect(w, r, to, err.Error())
		return
	}
	d, err := parseSnooze(r)
	if err != nil {
		s.redirect(w, r, to, err.Error())
		return
	}
	changed, left := 0, 0
	if maxID > 0 { // none counted: nothing to do
		f.MaxID = maxID
		again := url.Values{"action": {name}}
		for k, vs := range filter {
			again[k] = vs
		}
		n, _, err := s.admin.Count(r.Context(), f)
		switch {
		case err != nil:
			s.redirect(w, r, to, s.dbError("count the jobs", err))
			return
		case n > shown:
			s.redirect(w, r, "/bulk?"+again.Encode(), fmt.Sprintf("the filter selects %d jobs now, not the %d shown: confirm again", n, shown))
			return
		}
		ctx := context.WithoutCancel(r.Context()) // as in jobsAction
		err = s.admin.EachMatching(ctx, f, func(ids []int64) error {
			changes, err := act.do(ctx, s.admin, ids, d)
			for _, c := range changes {
				if c.Changed {
					changed++
				} else {
					left++
				}
			}
			return err
		})
		s.hub.poke()
		s.log.Info("console action", zap.String("who", userOf(r).Name), zap.String("action", name+" matching"),
			zap.String("filter", filter.Encode()), zap.Int64("max_id", maxID), zap.Int("changed", changed), zap.Int("left", left), zap.Error(err))
		if err != nil {
			s.redirect(w, r, to, summary(act, changed, left)+"; then stopped: "+s.dbError(name+" jobs", err))
			return
		}
	}
	s.redirect(w, r, to, summary(act, changed, left))
}

// queueAction pauses or resumes a queue.
func (s *Server) queueAction(w http.ResponseWriter, r *http.Request) {
	s.pauseAction(w, r, "queue", s.admin.Pause, s.admin.Resume)
}

// scheduleAction pauses or resumes a schedule.
func (s *Server) scheduleAction(w http.ResponseWriter, r *http.Request) {
	s.pauseAction(w, r, "schedule", s.admin.PauseSchedule, s.admin.ResumeSchedule)
}

func (s *Server) pauseAction(w http.ResponseWriter, r *http.Request, what string, pause, resume func(context.Context, string) (bool, error)) {
	to := back(r, "/")
	name, action := r.PostFormValue("name"), r.PostFormValue("action")
	f := map[string]func(context.Context, string) (bool, error){"pause": pause, "resume": resume}[action]
	if f == nil || name == "" {
		http.Error(w, "want action pause or resume, and a name", http.StatusBadRequest)
		return
	}
	changed, err := f(context.WithoutCancel(r.Context()), name) // as in jobsAction
	s.hub.poke()
	s.log.Info("console action", zap.String("who", userOf(r).Name), zap.String("action", action+" "+what),
		zap.String("name", name), zap.Bool("changed", changed), zap.Error(err))
	var msg string
	switch {
	case err != nil:
		msg = s.dbError(action+" "+what+" "+strconv.Quote(name), err)
	case changed:
		msg = fmt.Sprintf("%s %q: %sd", what, name, action)
	default:
		msg = fmt.Sprintf("%s %q was %sd already", what, name, action)
	}
	s.redirect(w, r, to, msg)
}

// endpointAction disables or enables an endpoint, or sets its note, as
// `pgdispatch endpoints disable|enable|note` do: disable sets the note
// too when the form's is not empty.
func (s *Server) endpointAction(w http.ResponseWriter, r *http.Request) {
	to := back(r, "/endpoints")
	endpoint, action, note := r.PostFormValue("endpoint"), r.PostFormValue("action"), r.PostFormValue("note")
	if endpoint == "" {
		http.Error(w, "want an endpoint", http.StatusBadRequest)
		return
	}
	if action == "disable" && !confirmed(r) {
		s.confirm(w, r, "endpoints", confirmView{
			Question: "Disable the endpoint " + visible(endpoint) + "?",
			What: "No request goes to it, not even a probe, and each of its jobs is dead, unsent, when next claimed, " +
				"until an operator enables it again.",
			Form:   "/actions/endpoints",
			Fields: []field{{"action", action}, {"endpoint", endpoint}, {"note", note}, {"back", to}},
			Yes:    "Yes, disable it", Back: to,
		})
		return
	}
	ctx := context.WithoutCancel(r.Context()) // as in jobsAction
	var (
		changed bool
		err     error
		msg     string
	)
	switch action {
	case "disable":
		changed, err = s.admin.DisableEndpoint(ctx, endpoint, note, s.cfg.EndpointEventJob)
		msg = "endpoint " + endpoint + ": disabled; its jobs are dead, unsent, when next claimed, until it is enabled"
		if !changed {
			msg = "endpoint " + endpoint + " was disabled already"
		}
	case "enable":
		changed, err = s.admin.EnableEndpoint(ctx, endpoint, s.cfg.EndpointEventJob)
		msg = "endpoint " + endpoint + ": enabled; the jobs that died while it was disabled: '" +
			endpoints.RetryCommand(endpoint) + "' counts them, --yes retries them"
		if !changed {
			msg = "endpoint " + endpoint + " was not disabled"
		}
	case "note":
		err = s.admin.SetEndpointNote(ctx, endpoint, note)
		changed = true
		msg = "endpoint " + endpoint + ": note set"
		if note == "" {
			msg = "endpoint " + endpoint + ": note cleared"
		}
	default:
		http.Error(w, "want action disable, enable or note", http.StatusBadRequest)
		return
	}
	s.log.Info("console action", zap.String("who", userOf(r).Name), zap.String("action", action+" endpoint"),
		zap.String("endpoint", endpoint), zap.Bool("changed", changed), zap.Error(err))
	if err != nil {
		msg = s.dbError(action+" endpoint", err)
	}
	s.redirect(w, r, to, msg)
}
