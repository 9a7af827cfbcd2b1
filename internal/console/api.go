package console

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/status"
)

// The JSON API under /ui/api/ serves the console's own JS: compact,
// column-oriented where a chart reads it.

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type apiError struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func writeJSONError(w http.ResponseWriter, err error) {
	writeJSONErrorAs(w, err, Principal{}, actRead)
}

func writeJSONErrorAs(w http.ResponseWriter, err error, p Principal, a action) {
	code, msg := errorMessage(err, p, a)
	writeJSON(w, code, apiError{Error: msg, Code: status.Code(err).String()})
}

func (h *handler) apiCluster(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	c, err := h.backend.ClusterStatus(ctx, r.cred)
	if err != nil {
		writeJSONErrorAs(w, err, r.sess.principal, actRead)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// apiRule is one rule's live figures.
type apiRule struct {
	Name   string    `json:"name"`
	DPS    float64   `json:"dps"`
	Denied float64   `json:"denied"`
	Util   float64   `json:"util"`
	Spark  []float64 `json:"spark"`
	Bound  int64     `json:"bound"`
	Text   [4]string `json:"text"` // dps, denied, util and bound as the page formats them
}

func (h *handler) apiRules(w http.ResponseWriter, r *request) {
	ctx, cancel := h.call(r)
	defer cancel()
	rules, err := h.backend.ListRules(ctx, r.cred)
	if err != nil {
		writeJSONErrorAs(w, err, r.sess.principal, actRead)
		return
	}
	out := make([]apiRule, len(rules))
	for i, x := range rules {
		out[i] = apiRule{Name: x.Name, DPS: x.DecisionsPerSecond, Denied: x.DeniedRatio, Util: x.Utilisation, Spark: x.Sparkline, Bound: x.Bound,
			Text: [4]string{formatRate(x.DecisionsPerSecond), formatPct(x.DeniedRatio), formatPct(x.Utilisation), strconv.FormatInt(x.Bound, 10)}}
	}
	writeJSON(w, http.StatusOK, map[string]any{"rules": out})
}

// apiSeriesResp is a rule's series in uPlot's column order.
type apiSeriesResp struct {
	T            []int64   `json:"t"` // unix seconds
	Admitted     []int64   `json:"admitted"`
	Denied       []int64   `json:"denied"`
	ShadowDenied []int64   `json:"shadowDenied"`
	Permits      []int64   `json:"permits"`
	Util         []float64 `json:"util"`
}

// apiSeries serves the last `seconds` (default 300, at most 3600) of a
// rule's 1 s series.
func (h *handler) apiSeries(w http.ResponseWriter, r *request) {
	secs := 300
	if s := r.URL.Query().Get("seconds"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 3600 {
			writeJSON(w, http.StatusBadRequest, apiError{Error: "seconds must be 1..3600", Code: "InvalidArgument"})
			return
		}
		secs = n
	}
	to := h.opts.Now().Truncate(time.Second).Add(time.Second)
	from := to.Add(-time.Duration(secs) * time.Second)
	ctx, cancel := h.call(r)
	defer cancel()
	pts, err := h.backend.RuleSeries(ctx, r.cred, r.PathValue("name"), from, to)
	if err != nil {
		writeJSONErrorAs(w, err, r.sess.principal, actRead)
		return
	}
	n := len(pts)
	out := apiSeriesResp{T: make([]int64, n), Admitted: make([]int64, n), Denied: make([]int64, n),
		ShadowDenied: make([]int64, n), Permits: make([]int64, n), Util: make([]float64, n)}
	for i, p := range pts {
		out.T[i] = p.Time.Unix()
		out.Admitted[i], out.Denied[i], out.ShadowDenied[i] = p.Admitted, p.Denied, p.ShadowDenied
		out.Permits[i], out.Util[i] = p.Permits, p.Utilisation
	}
	writeJSON(w, http.StatusOK, out)
}

type apiTopKey struct {
	Key        string `json:"key"`
	Count      int64  `json:"count"`
	ErrorBound int64  `json:"errorBound"`
}

// apiTop serves a rule's top keys: n (default 10, at most 100), window
// (1m or 1h) and denied (true for denied permits).
func (h *handler) apiTop(w http.ResponseWriter, r *request) {
	n := 10
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 100 {
			writeJSON(w, http.StatusBadRequest, apiError{Error: "n must be 1..100", Code: "InvalidArgument"})
			return
		}
		n = v
	}
	denied := r.URL.Query().Get("denied") == "true"
	ctx, cancel := h.call(r)
	defer cancel()
	keys, err := h.backend.TopKeys(ctx, r.cred, r.PathValue("name"), n, windows[windowParam(r)], denied)
	if err != nil {
		writeJSONErrorAs(w, err, r.sess.principal, actRead)
		return
	}
	out := make([]apiTopKey, len(keys))
	for i, k := range keys {
		out[i] = apiTopKey(k)
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": out})
}
