// Package tlsmetrics exports what Weir's certificate sources hold as
// Prometheus metrics: when each certificate expires, and how often the
// files were reloaded. (Apart from tlsconfig, so that lbctl does not link
// Prometheus' client.)
package tlsmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirlb/weir/internal/tlsconfig"
)

var (
	expiry = prometheus.NewDesc("weir_certificate_expiry_timestamp_seconds",
		"When a certificate in use expires (Unix time): use says what for, kind is certificate or ca (the earliest in the bundle), file the file it is read from.",
		[]string{"use", "kind", "file"}, nil)
	reloads = prometheus.NewDesc("weir_certificate_reloads_total",
		"Changes of a source's certificate files taken (result success), or refused because they did not load (result failure: the last good ones stay in use).",
		[]string{"use", "result"}, nil)
)

// Collector reads its sources at each scrape.
type Collector []*tlsconfig.Source

// Describe implements prometheus.Collector.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- expiry
	ch <- reloads
}

// Collect implements prometheus.Collector.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c {
		st := s.State()
		if st.CertFile != "" {
			ch <- prometheus.MustNewConstMetric(expiry, prometheus.GaugeValue, float64(st.CertNotAfter.Unix()), st.Use, "certificate", st.CertFile)
		}
		if st.CAFile != "" {
			ch <- prometheus.MustNewConstMetric(expiry, prometheus.GaugeValue, float64(st.CANotAfter.Unix()), st.Use, "ca", st.CAFile)
		}
		ch <- prometheus.MustNewConstMetric(reloads, prometheus.CounterValue, st.Reloads, st.Use, "success")
		ch <- prometheus.MustNewConstMetric(reloads, prometheus.CounterValue, st.FailedReloads, st.Use, "failure")
	}
}
