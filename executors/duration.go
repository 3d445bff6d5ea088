package executors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Duration reads a payload duration written either as a Go duration string
// ("1.5s", "2m") or as a number of seconds. Negative values are refused.
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch v := v.(type) {
	case string:
		parsed, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("must be a duration such as \"30s\": %w", err)
		}
		if parsed < 0 {
			return errors.New("must not be negative")
		}
		*d = Duration(parsed)
	case float64:
		if v < 0 || math.IsNaN(v) || v > math.MaxInt64/float64(time.Second) {
			return errors.New("must be a non-negative number of seconds")
		}
		*d = Duration(v * float64(time.Second))
	default:
		return errors.New("must be a duration string or a number of seconds")
	}
	return nil
}

// PayloadDuration reads the optional duration field of a JSON object payload.
// Errors name the field, as in `payload.timeout: must not be negative`.
func PayloadDuration(payload json.RawMessage, field string) (d time.Duration, ok bool, err error) {
	// Most payloads lack the field: skip decoding them.
	if len(payload) == 0 || !bytes.Contains(payload, []byte(`"`+field+`"`)) {
		return 0, false, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(payload, &obj); err != nil {
		// Not an object: the field is absent. The executor reports the shape.
		return 0, false, nil //nolint:nilerr // absence is not this function's error
	}
	raw, ok := obj[field]
	if !ok || string(raw) == "null" {
		return 0, false, nil
	}
	var v Duration
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, false, fmt.Errorf("payload.%s: %w", field, err)
	}
	return time.Duration(v), true, nil
}
