package rule

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzRuleJSON decodes arbitrary JSON as a rule (the form tokenctl's YAML
// becomes and the Raft log stores): validation never panics, refusals are
// ErrInvalid, and an accepted rule is within the caps.
func FuzzRuleJSON(f *testing.F) {
	f.Add([]byte(`{"name":"api","algorithm":1,"limit":10,"period":1000000000}`))
	f.Add([]byte(`{"name":"api","algorithm":6,"limit":10,"period":3600000000000,"max_keys":0}`))
	f.Add([]byte(`{"name":"a","algorithm":1,"limit":9223372036854775807,"period":9223372036854775807,"penalty":9223372036854775807}`))
	f.Add([]byte(`{"name":"a","algorithm":1,"limit":1,"period":1,"deny":["\xff"],"overrides":[{"key":"v","limit":2}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Rule
		if json.Unmarshal(b, &r) != nil {
			return
		}
		r.Normalize()
		if err := r.Validate(); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("refusal %v is not ErrInvalid", err)
			}
			return
		}
		if r.EncodedSize() > MaxRuleBytes || r.Limit <= 0 || r.Period <= 0 {
			t.Fatalf("accepted a rule past the caps: %+v", r)
		}
		for _, k := range append(append([]string{}, r.Deny...), r.Allow...) {
			if !utf8.ValidString(k) {
				t.Fatalf("accepted a key that is not UTF-8: %q", k)
			}
		}
		Compile(&r)
	})
}

// FuzzRequestNames is the request validators' part: ValidName and ValidKey
// accept only what the data plane can index.
func FuzzRequestNames(f *testing.F) {
	f.Add("api", "user-1")
	f.Add("", "\xff")
	f.Add("a b", "")
	f.Fuzz(func(t *testing.T, name, key string) {
		if ValidName(name) == nil && (len(name) == 0 || len(name) > MaxNameLen || !utf8.ValidString(name)) {
			t.Fatalf("accepted rule name %q", name)
		}
		if err := ValidKey(key); err == nil && (len(key) == 0 || len(key) > MaxKeyLen || !utf8.ValidString(key)) {
			t.Fatalf("accepted key %q", key)
		} else if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatal(err)
		}
	})
}
