package executors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// FieldError says which payload field is wrong and why, as
// `payload.url: must be an absolute http(s) URL`.
type FieldError struct {
	Field string // dotted path below payload; empty for the payload itself
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "payload: " + e.Msg
	}
	return "payload." + e.Field + ": " + e.Msg
}

// Invalid returns a permanent error for a bad payload field.
func Invalid(field, format string, args ...any) error {
	return Permanent(&FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// DecodePayload decodes a JSON object payload into v strictly: unknown fields
// and wrong types are permanent errors that name the field.
func DecodePayload(payload json.RawMessage, v any) error {
	if len(bytes.TrimSpace(payload)) == 0 {
		return Invalid("", "is empty: want a JSON object")
	}
	if !utf8.Valid(payload) {
		return Invalid("", "is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Permanent(describeJSONError(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Invalid("", "has data after the JSON object")
	}
	return nil
}

func describeJSONError(err error) *FieldError {
	var (
		typeErr   *json.UnmarshalTypeError
		syntaxErr *json.SyntaxError
	)
	switch {
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return &FieldError{Msg: "must be a JSON object, not " + jsonKind(typeErr.Value)}
		}
		return &FieldError{Field: typeErr.Field, Msg: fmt.Sprintf("must be %s, not %s", goKind(typeErr.Type.Kind().String()), jsonKind(typeErr.Value))}
	case errors.As(err, &syntaxErr):
		return &FieldError{Msg: fmt.Sprintf("is not valid JSON (at byte %d)", syntaxErr.Offset)}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &FieldError{Field: name, Msg: "unknown field"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &FieldError{Msg: "is truncated JSON"}
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe
	}
	return &FieldError{Msg: err.Error()}
}

func jsonKind(v string) string {
	switch v {
	case "number", "string":
		return "a " + v
	case "array", "object":
		return "an " + v
	case "bool":
		return "true or false"
	case "null":
		return "null"
	}
	if strings.HasPrefix(v, "number") {
		return "a number"
	}
	return v
}

func goKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	case "map", "struct":
		return "an object"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "a whole number"
	case "float32", "float64":
		return "a number"
	}
	return "another type"
}

// Body turns a payload's data or body field into the bytes to send: a JSON
// string is sent raw, as the AT Worker did; any other JSON value is sent as
// JSON. An absent field sends nothing.
func Body(raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			return []byte(s)
		}
	}
	return raw
}

// HeaderValue checks a header name and value supplied by a payload.
func HeaderValue(field, name, value string) error {
	if name == "" {
		return Invalid(field, "header names must not be empty")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", rune(c)) {
			return Invalid(field+"."+name, "is not a valid header name")
		}
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return Invalid(field+"."+name, "must not contain CR, LF or NUL")
	}
	return nil
}

// Headers checks a payload's header map: each value must be a string, and
// each name and value fit for a header. Errors name the header, as in
// `payload.headers.X-Api-Key: must be a string, not a number`.
func Headers(field string, raw map[string]json.RawMessage) (map[string]string, error) {
	if raw == nil {
		return nil, nil
	}
	out := make(map[string]string, len(raw))
	for name, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, Invalid(field+"."+name, "must be a string, not %s", jsonKind(valueKind(v)))
		}
		if err := HeaderValue(field, name, s); err != nil {
			return nil, err
		}
		out[name] = s
	}
	return out, nil
}

func valueKind(v json.RawMessage) string {
	switch b := bytes.TrimSpace(v); {
	case len(b) == 0:
		return "nothing"
	case b[0] == '{':
		return "object"
	case b[0] == '[':
		return "array"
	case b[0] == 't' || b[0] == 'f':
		return "bool"
	case b[0] == 'n':
		return "null"
	case b[0] == '"':
		return "string"
	}
	return "number"
}
