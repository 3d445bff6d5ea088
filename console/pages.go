package console

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/internal/redact"
	"github.com/pgdispatch/pgdispatch/triggers"
)

// page is what every page's template gets.
type page struct {
	Title string
	Nav   string
	User  user
	CSRF  string
	Flash string
	Error string
	Data  any
}

var funcs = template.FuncMap{
	"ts": func(t any) string {
		switch t := t.(type) {
		case time.Time:
			return t.UTC().Format("2006-01-02 15:04:05.000")
		case *time.Time:
			if t != nil {
				return t.UTC().Format("2006-01-02 15:04:05.000")
			}
		}
		return "—"
	},
	"str": func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	},
	"opt": func(s *string) string {
		if s == nil {
			return "—"
		}
		return *s
	},
	"short": func(s string, n int) string {
		if r := []rune(s); len(r) > n {
			return string(r[:n]) + "…"
		}
		return s
	},
	"secs":   seconds,
	"count":  func(n *int64) string { return countText(n) },
	"pretty": pretty,
	"vis":    visible,
	// shell writes an endpoint as a word of a shell command.
	"shell": endpoints.ShellArg,
	// state writes an endpoint's state as words: half_open is half-open.
	"state": func(state string) string { return strings.ReplaceAll(state, "_", "-") },
	"deref": func(n *int64) int64 {
		if n == nil {
			return 0
		}
		return *n
	},
}

func countText(n *int64) string {
	if n == nil {
		return "—"
	}
	return strconv.FormatInt(*n, 10)
}

// seconds writes an age: 0.4s, 12s, 5m3s, 2h10m.
func seconds(s *float64) string {
	if s == nil {
		return "—"
	}
	d := time.Duration(*s * float64(time.Second))
	switch {
	case d < 10*time.Second:
		return strconv.FormatFloat(math.Max(*s, 0), 'f', 1, 64) + "s"
	case d < time.Hour:
		return d.Truncate(time.Second).String()
	default:
		return d.Truncate(time.Minute).String()
	}
}

// visible writes the characters a terminal or a browser would act on or
// hide (controls, format characters such as the bidirectional overrides)
// as Go escapes them (\x1b, \u202e), so that a row shows what it holds.
func visible(s string) string {
	hidden := func(r rune) bool { return !strconv.IsGraphic(r) && r != '\n' && r != '\t' }
	if !strings.ContainsFunc(s, hidden) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if hidden(r) {
			q := strconv.QuoteRuneToGraphic(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// pretty indents a JSON document; what is not one is shown as it is. The
// characters a browser would hide or act on are written as visible writes
// them: within a JSON string, \u202e is the character's own escape.
func pretty(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return visible(string(raw))
	}
	return visible(b.String())
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "jobs", "job", "schedules", "bulk", "endpoints", "confirm"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: templates: %w", err)
		}
		pages[name] = t
	}
	return pages, nil
}

// render writes a page, or the template named block of it.
func (s *Server) render(w http.ResponseWriter, r *http.Request, name, block string, p page) {
	p.User = userOf(r)
	p.CSRF = s.csrfToken(p.User)
	if msg := r.URL.Query().Get("msg"); p.Flash == "" && hmac.Equal([]byte(s.sign(msg)), []byte(r.URL.Query().Get("sig"))) {
		p.Flash = msg
	}
	var b bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&b, block, p); err != nil {
		s.log.Error("render", zap.String("page", name), zap.Error(err))
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(b.Bytes())
}

// queueRow is a queue on the overview: its live figures, and the finished
// jobs kept (nil when their count ran out of time).
type queueRow struct {
	admin.LiveQueue
	Done, Dead, Cancelled *int64
	// Chart is the last hour's done and dead jobs; nil for none.
	Chart *chart
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	p := page{Title: "Overview", Nav: "overview"}
	live, err := s.admin.Live(r.Context())
	if err != nil {
		p.Error = s.dbError("read the queues", err)
	}
	stats, counted, err := s.admin.Stats(r.Context(), 0)
	if err != nil && p.Error == "" {
		p.Error = s.dbError("count the jobs", err)
	}
	byName := map[string]*queueRow{}
	var rows []*queueRow
	for _, q := range live.Queues {
		row := &queueRow{LiveQueue: q}
		byName[q.Queue] = row
		rows = append(rows, row)
	}
	add := func(to **int64, n *int64) {
		if n == nil {
			return
		}
		if *to == nil {
			*to = new(int64)
		}
		**to += *n
	}
	for _, st := range stats {
		row := byName[st.Queue]
		if row == nil {
			row = &queueRow{LiveQueue: admin.LiveQueue{Queue: st.Queue, Paused: st.Paused}}
			byName[st.Queue] = row
			rows = append(rows, row)
		}
		add(&row.Done, st.Done)
		add(&row.Dead, st.Dead)
		add(&row.Cancelled, st.Cancelled)
	}
	if counted {
		for _, row := range rows {
			for _, n := range []**int64{&row.Done, &row.Dead, &row.Cancelled} {
				if *n == nil {
					*n = new(int64)
				}
			}
		}
	}
	hour, err := s.admin.LastHour(r.Context())
	if err != nil && p.Error == "" {
		p.Error = s.dbError("count the last hour", err)
	}
	drawn := charts(hour, time.Now())
	for _, row := range rows {
		row.Chart = drawn[row.Queue]
	}
	slices.SortFunc(rows, func(a, b *queueRow) int { return strings.Compare(a.Queue, b.Queue) })
	// The first queues by name, as many as the live state lists.
	s.hub.mu.Lock()
	maxQueues := s.hub.maxQueues
	s.hub.mu.Unlock()
	more := max(len(rows)-maxQueues, 0)
	rows = rows[:len(rows)-more]
	endpoints, err := s.admin.EndpointCounts(r.Context())
	if err != nil && p.Error == "" {
		p.Error = s.dbError("count the endpoints", err)
	}
	p.Data = struct {
		Queues []*queueRow
		// MoreQueues is how many queues past the first maxQueues are left
		// out.
		MoreQueues int
		Workers    []admin.Worker
		Counted    bool
		// Endpoints counts the endpoints disabled, open and half-open.
		Endpoints admin.EndpointCount
	}{rows, more, live.Workers, counted, endpoints}
	s.render(w, r, "overview", "layout.html", p)
}

// dbError logs err and returns what the page says: the database's own
// words are the operator's to see (a read-only role's refusal, a timeout).
func (s *Server) dbError(what string, err error) string {
	s.log.Warn(what, zap.Error(err))
	return "could not " + what + ": " + redact.Text(err.Error())
}

// jobsView is the jobs page's filter, as the form and the links write it.
type jobsView struct {
	Query    url.Values
	Filter   admin.JobFilter
	Statuses []string
	Sorts    []string
	Fields   []string
	Jobs     []admin.Job
	// Held is, for each pending http_callback job of the page whose
	// endpoint is open, half-open or disabled, that endpoint.
	Held  map[int64]*admin.Endpoint
	Next  string // the next page's URL, empty on the last
	First string // the first page's URL, when not on it
	Since string
	Until string
}

// Link returns the URL of the jobs page with the filter and key set to
// value (and the cursor dropped).
func (v jobsView) Link(key, value string) string {
	q := url.Values{}
	for k, vs := range v.Query {
		if k != "after" && k != "msg" && k != "sig" && k != "fragment" {
			q[k] = vs
		}
	}
	q.Set(key, value)
	return "/jobs?" + q.Encode()
}

// Here is the URL of this page, for an action to return to.
func (v jobsView) Here() string {
	q := url.Values{}
	for k, vs := range v.Query {
		if k != "msg" && k != "sig" && k != "fragment" {
			q[k] = vs
		}
	}
	return "/jobs?" + q.Encode()
}

// SortLink is the link of a column's header: its sort, newest first, or
// the other way when it is the sort already.
func (v jobsView) SortLink(col string) string {
	q := url.Values{}
	for k, vs := range v.Query {
		if k != "after" && k != "msg" && k != "sig" && k != "fragment" && k != "asc" {
			q[k] = vs
		}
	}
	q.Set("sort", col)
	if v.sort() == col && !v.Filter.Asc {
		q.Set("asc", "1")
	}
	return "/jobs?" + q.Encode()
}

// SortMark is the arrow beside the sorted column.
func (v jobsView) SortMark(col string) string {
	switch {
	case v.sort() != col:
		return ""
	case v.Filter.Asc:
		return " ▲"
	default:
		return " ▼"
	}
}

func (v jobsView) sort() string {
	if v.Filter.Sort == "" {
		return "id"
	}
	return v.Filter.Sort
}

// HasStatus reports whether the filter selects status.
func (v jobsView) HasStatus(status string) bool { return slices.Contains(v.Filter.Statuses, status) }

// BulkLink is the whole URL of the confirmation of action on every job
// the filter selects: the filter, and the sort, which bounds the statuses
// the list shows.
func (v jobsView) BulkLink(action string) string {
	q := url.Values{}
	for k, vs := range v.Query {
		if filterKeys[k] && k != "after" && k != "limit" && k != "asc" {
			q[k] = vs
		}
	}
	q.Set("action", action)
	return "/bulk?" + q.Encode()
}

const timeForm = "2006-01-02T15:04"

// parseTime reads a time as a datetime-local field writes it (taken as
// UTC), or RFC 3339.
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{timeForm, timeForm + ":05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("time %q: want 2026-01-02T15:04 (UTC) or RFC 3339", s)
}

// filterKeys are the keys of the jobs page's filter, its order and its
// cursor; pageKeys those of the page itself.
var (
	filterKeys = map[string]bool{
		"status": true, "queue": true, "kind": true, "id": true, "error": true, "tf": true,
		"since": true, "until": true, "sort": true, "asc": true, "after": true, "limit": true,
	}
	pageKeys = map[string]bool{"msg": true, "sig": true, "fragment": true}
)

// errorFilterForOperators is what a viewer is told who filters on
// last_error: the filter searches the stored text, secrets included, which
// a viewer is shown masked.
var errorFilterForOperators = errors.New(`the "error has" filter is for operators: it searches the errors as stored, ` +
	"secrets included, which a viewer sees masked")

// parseFilter reads the jobs page's filter from q, which holds nothing
// else; the text in last_error is for operators only.
func parseFilter(q url.Values, u user) (admin.JobFilter, error) {
	var errs []error
	for k := range q {
		if !filterKeys[k] {
			errs = append(errs, fmt.Errorf("unknown filter %q", k))
		}
	}
	if q.Get("error") != "" && !u.Operator() {
		errs = append(errs, errorFilterForOperators)
	}
	f := admin.JobFilter{
		Queue:     strings.TrimSpace(q.Get("queue")),
		Kind:      strings.TrimSpace(q.Get("kind")),
		ErrorText: q.Get("error"),
		TimeField: q.Get("tf"),
		Sort:      q.Get("sort"),
		Asc:       q.Get("asc") == "1",
	}
	for _, st := range q["status"] {
		if st != "" {
			f.Statuses = append(f.Statuses, st)
		}
	}
	if id := strings.TrimSpace(q.Get("id")); id != "" {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("job id %q: want a number above 0", id))
		}
		f.ID = n
	}
	var err error
	if f.Since, err = parseTime(q.Get("since")); err != nil {
		errs = append(errs, err)
	}
	if f.Until, err = parseTime(q.Get("until")); err != nil {
		errs = append(errs, err)
	}
	if f.After, err = admin.ParseCursor(q.Get("after")); err != nil {
		errs = append(errs, err)
	}
	if n := q.Get("limit"); n != "" {
		if f.Limit, err = strconv.Atoi(n); err != nil || f.Limit < 1 || f.Limit > 500 {
			errs = append(errs, fmt.Errorf("limit %q: want 1 to 500", n))
		}
	}
	return f, errors.Join(errs...)
}

func (s *Server) jobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := jobsView{Query: q, Statuses: admin.Statuses, Sorts: admin.Sorts, Fields: admin.TimeFields, Since: q.Get("since"), Until: q.Get("until")}
	p := page{Title: "Jobs", Nav: "jobs"}
	f, err := parseFilter(without(q, pageKeys), userOf(r))
	v.Filter = f
	if err != nil {
		p.Error = err.Error()
	} else {
		jobs, next, err := s.admin.Page(r.Context(), f)
		if err != nil {
			p.Error = s.dbError("list the jobs", err)
		}
		v.Held, err = s.admin.EndpointsHolding(r.Context(), jobs)
		if err != nil && p.Error == "" {
			p.Error = s.dbError("read the jobs' endpoints", err)
		}
		for i := range jobs {
			jobs[i].Mask()
		}
		v.Jobs = jobs
		if next != nil {
			v.Next = v.Link("after", next.String())
		}
		if f.After != nil {
			v.First = v.Link("after", "")
		}
	}
	p.Data = v
	block := "layout.html"
	if q.Get("fragment") == "1" {
		block = "rows"
	}
	s.render(w, r, "jobs", block, p)
}

// without returns q without the keys drop holds.
func without(q url.Values, drop map[string]bool) url.Values {
	out := url.Values{}
	for k, vs := range q {
		if !drop[k] {
			out[k] = vs
		}
	}
	return out
}

// describe says in words which jobs f selects.
func describe(f admin.JobFilter) string {
	var parts []string
	if len(f.Statuses) > 0 {
		parts = append(parts, "status "+strings.Join(f.Statuses, " or "))
	}
	switch f.Sort {
	case "run_at":
		parts = append(parts, "pending (the list by run_at)")
	case "finished_at":
		parts = append(parts, "finished (the list by finished_at)")
	}
	if f.Queue != "" {
		parts = append(parts, "queue "+strconv.Quote(f.Queue))
	}
	if f.Kind != "" {
		parts = append(parts, "kind "+strconv.Quote(f.Kind))
	}
	if f.ID != 0 {
		parts = append(parts, "id "+strconv.FormatInt(f.ID, 10))
	}
	if f.ErrorText != "" {
		parts = append(parts, "last_error has "+strconv.Quote(f.ErrorText))
	}
	if !f.Since.IsZero() || !f.Until.IsZero() {
		tf := cmp.Or(f.TimeField, "created_at")
		if !f.Since.IsZero() {
			parts = append(parts, tf+" from "+f.Since.UTC().Format(time.RFC3339))
		}
		if !f.Until.IsZero() {
			parts = append(parts, tf+" before "+f.Until.UTC().Format(time.RFC3339))
		}
	}
	if len(parts) == 0 {
		return "every job in the table"
	}
	return strings.Join(parts, "; ")
}

// timelineEntry is a moment of a job's life.
type timelineEntry struct {
	At   time.Time
	What string
}

func (s *Server) job(w http.ResponseWriter, r *http.Request) { s.showJob(w, r, false) }

// reveal shows a job's page with its secrets, to an operator who asked
// with a POST from the page (its CSRF token), and logs who did.
func (s *Server) reveal(w http.ResponseWriter, r *http.Request) { s.showJob(w, r, true) }

func (s *Server) showJob(w http.ResponseWriter, r *http.Request, reveal bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		http.Error(w, "not a job id", http.StatusNotFound)
		return
	}
	j, err := s.admin.Get(r.Context(), id)
	if errors.Is(err, admin.ErrNotFound) {
		http.Error(w, fmt.Sprintf("no job %d: it was never made, or it was deleted or purged", id), http.StatusNotFound)
		return
	}
	p := page{Title: fmt.Sprintf("Job %d", id), Nav: "jobs"}
	if err != nil {
		p.Error = s.dbError("read the job", err)
		s.render(w, r, "job", "layout.html", p)
		return
	}
	// What holds the job back, as `jobs show` says it; the rest of the
	// page shows without it.
	wait, err := s.admin.FlowWait(r.Context(), j)
	if err != nil {
		p.Error = s.dbError("read why the job waits", err)
	}
	held, err := s.admin.EndpointsHolding(r.Context(), []admin.Job{j})
	if err != nil && p.Error == "" {
		p.Error = s.dbError("read the job's endpoint", err)
	}
	u := userOf(r)
	reveal = reveal && u.Operator()
	masked := false
	if !reveal {
		masked = j.Mask()
	} else {
		s.log.Info("console action", zap.String("who", u.Name), zap.String("action", "reveal"), zap.Int64("job_id", id))
	}
	attempts, skipped := j.History()
	var timeline []timelineEntry
	timeline = append(timeline, timelineEntry{j.CreatedAt, "created"})
	for _, a := range attempts {
		if a.StartedAt != nil {
			timeline = append(timeline, timelineEntry{*a.StartedAt, fmt.Sprintf("attempt %d started on %s", a.Attempt, a.Worker)})
		}
		if a.FinishedAt != nil {
			timeline = append(timeline, timelineEntry{*a.FinishedAt, fmt.Sprintf("attempt %d failed: %s", a.Attempt, a.Error)})
		}
	}
	switch {
	case j.Status == "running":
		timeline = append(timeline, timelineEntry{j.UpdatedAt, fmt.Sprintf("attempt %d running on %s", j.Attempts, derefOr(j.LockedBy, "?"))})
	case j.FinishedAt != nil:
		timeline = append(timeline, timelineEntry{*j.FinishedAt, j.Status})
	case j.Status == "pending":
		timeline = append(timeline, timelineEntry{j.RunAt, "due"})
	}
	slices.SortStableFunc(timeline, func(a, b timelineEntry) int { return a.At.Compare(b.At) })
	p.Data = struct {
		Job      admin.Job
		Attempts []admin.Attempt
		Skipped  int
		Masked   bool
		Revealed bool
		Timeline []timelineEntry
		// Waiting is why a pending job with a flow key is not started
		// (admin.FlowWait); empty for any other.
		Waiting string
		// Endpoint is the endpoint of a pending http_callback job while
		// it is open, half-open or disabled (admin.EndpointsHolding); nil
		// for any other.
		Endpoint *admin.Endpoint
	}{j, attempts, skipped, masked, reveal, timeline, wait, held[j.ID]}
	s.render(w, r, "job", "layout.html", p)
}

func derefOr(s *string, def string) string {
	if s == nil {
		return def
	}
	return *s
}

func (s *Server) schedules(w http.ResponseWriter, r *http.Request) {
	p := page{Title: "Schedules", Nav: "schedules"}
	scheds, err := s.admin.Schedules(r.Context())
	if err != nil {
		p.Error = s.dbError("list the schedules", err)
	}
	for i := range scheds {
		scheds[i].Payload = maskPayload(scheds[i].Payload)
	}
	ctx, cancel := contextTimeout(r, s)
	defer cancel()
	trigs, err := triggers.List(ctx, s.cfg.Pool, s.cfg.Schema)
	if err != nil && p.Error == "" {
		p.Error = s.dbError("list the dispatch triggers", err)
	}
	for i := range trigs {
		trigs[i].Payload = maskPayload(trigs[i].Payload)
	}
	p.Data = struct {
		Schedules []admin.Schedule
		Triggers  []triggers.Trigger
	}{scheds, trigs}
	s.render(w, r, "schedules", "layout.html", p)
}

// maxEndpointsShown is the most endpoints the endpoints page lists; it
// counts the others.
const maxEndpointsShown = 500

// maxEndpointEventsShown is the most events the endpoints page lists, the
// newest.
const maxEndpointEventsShown = 50

// endpoints shows the endpoints of http_callback jobs and their circuit
// breakers, as `pgdispatch endpoints list` does: the disabled first, then
// those not closed; and their newest events, as `pgdispatch endpoints
// events` does.
func (s *Server) endpoints(w http.ResponseWriter, r *http.Request) {
	p := page{Title: "Endpoints", Nav: "endpoints"}
	list, err := s.admin.Endpoints(r.Context())
	if err != nil {
		p.Error = s.dbError("list the endpoints", err)
	}
	disabled, notClosed := 0, 0
	for _, e := range list {
		switch {
		case e.DisabledAt != nil:
			disabled++
		case e.State != "closed":
			notClosed++
		}
	}
	events, err := s.admin.EndpointEvents(r.Context(), "", maxEndpointEventsShown)
	if err != nil && p.Error == "" {
		p.Error = s.dbError("list the endpoints' events", err)
	}
	shown := list[:min(len(list), maxEndpointsShown)]
	p.Data = struct {
		// Endpoints are the first maxEndpointsShown of the Total.
		Endpoints []admin.Endpoint
		// Disabled counts the disabled endpoints, NotClosed the others
		// that are open or half-open.
		Total, Disabled, NotClosed int
		More                       int
		// Events are the newest maxEndpointEventsShown events.
		Events    []admin.EndpointEvent
		MaxEvents int
	}{shown, len(list), disabled, notClosed, len(list) - len(shown), events, maxEndpointEventsShown}
	s.render(w, r, "endpoints", "layout.html", p)
}

func maskPayload(raw json.RawMessage) json.RawMessage {
	j := admin.Job{Payload: raw}
	j.Mask()
	return j.Payload
}
