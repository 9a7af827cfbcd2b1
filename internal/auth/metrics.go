package auth

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics registers on reg a collector of the token file's reload
// state, read at each scrape:
//   - tokenserver_auth_tokens_reload_ok: 1 when the last look at the file
//     loaded it whole (or found it unchanged), 0 after a read error (the
//     file deleted: the previous tokens stay) or a content with bad lines
//     (left out) or none good (refused);
//   - tokenserver_auth_tokens_last_reload_success_timestamp_seconds: when
//     a look last succeeded.
//
// Without a token file nothing is exported.
func (a *Authenticator) RegisterMetrics(reg prometheus.Registerer) error {
	if err := reg.Register(authCollector{a}); err != nil {
		return fmt.Errorf("auth metrics: %w", err)
	}
	return nil
}

var (
	descTokensOK = prometheus.NewDesc("tokenserver_auth_tokens_reload_ok",
		"1 when the last look at the --auth-tokens file loaded it whole or found it unchanged; 0 after a failed read or a content with bad lines.", nil, nil)
	descTokensLast = prometheus.NewDesc("tokenserver_auth_tokens_last_reload_success_timestamp_seconds",
		"Unix time of the last successful look at the --auth-tokens file.", nil, nil)
)

type authCollector struct{ a *Authenticator }

func (c authCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descTokensOK
	ch <- descTokensLast
}

func (c authCollector) Collect(ch chan<- prometheus.Metric) {
	if c.a.watch == nil {
		return
	}
	st := c.a.watch.Status()
	ok := 0.0
	if st.OK {
		ok = 1
	}
	ch <- prometheus.MustNewConstMetric(descTokensOK, prometheus.GaugeValue, ok)
	if !st.LastSuccess.IsZero() {
		ch <- prometheus.MustNewConstMetric(descTokensLast, prometheus.GaugeValue, float64(st.LastSuccess.UnixNano())/1e9)
	}
}
