package rulefile

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/rulepb"
)

// randomRule draws a rule over every field a file may set, the cost
// fields (calendar, time_zone, inline, reservation_ttl, durable)
// included; it may be invalid.
func randomRule(r *rand.Rand) (*rule.Rule, bool) {
	algs := []bucket.Algorithm{bucket.TokenBucket, bucket.LeakyBucket, bucket.FixedWindow, bucket.SlidingWindow, bucket.SlidingLog, bucket.Concurrency}
	periods := []time.Duration{time.Second, 1500 * time.Millisecond, time.Minute, time.Hour, 24 * time.Hour}
	zones := []string{"", "UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"}
	ru := &rule.Rule{
		Name:      "r" + string(rune('a'+r.IntN(26))),
		Algorithm: algs[r.IntN(len(algs))],
		Limit:     1 + r.Int64N(10_000),
		Period:    periods[r.IntN(len(periods))],
	}
	if r.IntN(2) == 0 {
		ru.Burst = ru.Limit + r.Int64N(100)
	}
	if r.IntN(3) == 0 {
		ru.Overrides = []rule.Override{{Key: "vip", Limit: 1 + r.Int64N(100)}}
	}
	if r.IntN(3) == 0 {
		ru.Lease = rule.Lease{MaxBatch: 1 + r.Int64N(50), TTL: time.Duration(1+r.IntN(900)) * time.Millisecond}
	}
	switch r.IntN(3) {
	case 0:
		ru.Algorithm = bucket.FixedWindow
		ru.Calendar = bucket.Calendar(1 + r.IntN(int(bucket.CalendarMonth)))
		ru.TimeZone = zones[r.IntN(len(zones))]
		if r.IntN(2) == 0 {
			ru.Period = 0 // not needed with a calendar
		}
	case 1:
		ru.Inline = rule.InlinePolicy{MaxLimit: 1 + r.Int64N(1_000_000)}
		if r.IntN(2) == 0 {
			ru.Inline.MaxPeriod = periods[r.IntN(len(periods))]
		}
	}
	if r.IntN(2) == 0 && ru.Period > 0 {
		ru.ReservationTTL = time.Duration(1 + r.Int64N(int64(ru.Period)))
	}
	durable := r.IntN(2) == 0
	n := ru.Clone()
	n.Normalize()
	return ru, durable && n.Validate() == nil
}

// TestRoundTripListOutput (property): every valid rule, printed as 'rule
// get -o json|yaml' prints it (protojson of the proto, and that as YAML),
// reads back as the same rule, durable included.
func TestRoundTripListOutput(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 2026))
	valid, withCost := 0, 0
	for i := 0; i < 3000; i++ {
		want, durable := randomRule(r)
		n := want.Clone()
		n.Normalize()
		if n.Validate() != nil {
			continue
		}
		valid++
		if want.Calendar != bucket.CalendarNone || want.Inline.MaxLimit > 0 || want.ReservationTTL > 0 {
			withCost++
		}
		p := rulepb.ToProto(want)
		p.Durable = durable
		js, err := protojson.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var tree any
		if err := yaml.Unmarshal(js, &tree); err != nil {
			t.Fatal(err)
		}
		ys, err := yaml.Marshal(tree)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range []struct{ name, text string }{{"r.json", string(js)}, {"r.yaml", string(ys)}} {
			rs, err := Parse(doc.name, []byte(doc.text))
			if err != nil {
				t.Fatalf("%s of %+v does not read back: %v\n%s", doc.name, want, err, doc.text)
			}
			if len(rs) != 1 || !reflect.DeepEqual(rs[0].Rule, want) || rs[0].Durable != durable {
				t.Fatalf("%s read back as %+v (durable %v), want %+v (durable %v)\n%s", doc.name, rs[0].Rule, rs[0].Durable, want, durable, doc.text)
			}
		}
	}
	if valid < 1000 || withCost < 500 {
		t.Fatalf("only %d valid rules, %d with cost fields: the generator no longer covers the fields", valid, withCost)
	}
}

// TestParseCostFields: the cost fields in both spellings, and the errors
// that name them.
func TestParseCostFields(t *testing.T) {
	in := "name: c\nalgorithm: FIXED_WINDOW\nlimit: 1000\ncalendar: month\ntime_zone: Europe/Berlin\ndurable: true\n---\n" +
		"name: i\nalgorithm: TOKEN_BUCKET\nlimit: 10\nperiod: 1m\ninline: {maxLimit: 500, max_period: 1h}\nreservationTtl: 30s\n"
	rs, err := Parse("f.yaml", []byte(in))
	if err != nil || len(rs) != 2 {
		t.Fatalf("Parse = %+v, %v", rs, err)
	}
	if c := rs[0]; c.Rule.Calendar != bucket.CalendarMonth || c.Rule.TimeZone != "Europe/Berlin" || !c.Durable {
		t.Errorf("calendar rule = %+v durable %v", c.Rule, c.Durable)
	}
	if i := rs[1].Rule; i.Inline != (rule.InlinePolicy{MaxLimit: 500, MaxPeriod: time.Hour}) || i.ReservationTTL != 30*time.Second {
		t.Errorf("inline rule = %+v", i)
	}
	for _, tc := range []struct{ in, want string }{
		{"name: c\nalgorithm: FIXED_WINDOW\nlimit: 1\ncalendar: fortnight\n", "f.yaml:4:11: rule \"c\": unknown calendar"},
		{"name: c\nalgorithm: FIXED_WINDOW\nlimit: 1\ncalendar: DAY\ntime_zone: Mars/Olympus\n", "f.yaml:5:1: rule \"c\": time_zone"},
		{"name: c\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\ninline: {max_limit: 1, maxLimit: 2}\n", "set twice"},
		{"name: c\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\ndurable: maybe\n", "f.yaml:5:10"},
	} {
		_, err := Parse("f.yaml", []byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}
