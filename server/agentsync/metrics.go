package agentsync

import "github.com/prometheus/client_golang/prometheus"

// metrics prove convergence, with kube-proxy's names where it has them.
type metrics struct {
	programming prometheus.Histogram
	nacks       prometheus.Counter
	connected   prometheus.Gauge
	version     prometheus.Gauge
	messages    *prometheus.CounterVec
	bytes       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "weir_network_programming_duration_seconds",
			Help:    "From the server accepting a change to an agent acknowledging the state that holds it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_agent_nacks_total", Help: "States agents could not apply.",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_agents_connected", Help: "Agents with an open state stream.",
		}),
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weir_state_version", Help: "The newest state version, the store revision.",
		}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_sync_messages_total", Help: "State messages sent to agents, by kind (full, resume, delta).",
		}, []string{"kind"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_sync_sent_bytes_total", Help: "Bytes of state sent to agents.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.programming, m.nacks, m.connected, m.version, m.messages, m.bytes)
	}
	return m
}
