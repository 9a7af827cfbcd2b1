package tlsutil

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics registers on reg a collector of the certificates'
// state, read at each scrape:
//   - tokenserver_tls_certs_reload_ok: 1 when the last look at the files
//     loaded them (or found them unchanged), 0 after a failed read (a
//     deleted file), a content refused (the previous certificates stay in
//     use) or a deny list with bad lines;
//   - tokenserver_tls_certs_last_reload_success_timestamp_seconds;
//   - tokenserver_tls_cert_not_after_seconds{cert}: when each certificate
//     in use expires: cert is server (--tls-cert), peer (--peer-tls-cert),
//     client_ca or peer_ca (the earliest of the bundle's CAs).
//
// Without TLS files nothing is exported.
func (r *Reloader) RegisterMetrics(reg prometheus.Registerer) error {
	if err := reg.Register(tlsCollector{r}); err != nil {
		return fmt.Errorf("tls metrics: %w", err)
	}
	return nil
}

var (
	descReloadOK = prometheus.NewDesc("tokenserver_tls_certs_reload_ok",
		"1 when the last look at the TLS files loaded them or found them unchanged; 0 after a failed read or a refused content (the previous certificates stay in use).", nil, nil)
	descReloadLast = prometheus.NewDesc("tokenserver_tls_certs_last_reload_success_timestamp_seconds",
		"Unix time of the last successful look at the TLS files.", nil, nil)
	descNotAfter = prometheus.NewDesc("tokenserver_tls_cert_not_after_seconds",
		"Unix time at which a certificate in use expires (for a CA bundle, its first CA to expire).", []string{"cert"}, nil)
)

type tlsCollector struct{ r *Reloader }

func (c tlsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReloadOK
	ch <- descReloadLast
	ch <- descNotAfter
}

func (c tlsCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.r.Enabled() {
		return
	}
	st := c.r.watch.Status()
	ok := 0.0
	if st.OK {
		ok = 1
	}
	ch <- prometheus.MustNewConstMetric(descReloadOK, prometheus.GaugeValue, ok)
	if !st.LastSuccess.IsZero() {
		ch <- prometheus.MustNewConstMetric(descReloadLast, prometheus.GaugeValue, float64(st.LastSuccess.UnixNano())/1e9)
	}
	m := c.r.cur.Load()
	if m == nil {
		return
	}
	earliest := map[string]float64{}
	var order []string
	for _, nc := range m.named() {
		v := float64(nc.cert.NotAfter.Unix())
		if old, seen := earliest[nc.name]; !seen || v < old {
			if !seen {
				order = append(order, nc.name)
			}
			earliest[nc.name] = v
		}
	}
	for _, name := range order {
		ch <- prometheus.MustNewConstMetric(descNotAfter, prometheus.GaugeValue, earliest[name], name)
	}
}
