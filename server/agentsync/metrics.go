package agentsync

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/weirlb/weir/server/observed"
)

// metrics prove convergence, with kube-proxy's names where it has them.
type metrics struct {
	programming prometheus.Histogram
	nacks       prometheus.Counter
	connected   prometheus.Gauge
	version     prometheus.Gauge
	messages    *prometheus.CounterVec
	bytes       prometheus.Counter
	encoded     prometheus.Counter
	// stateVersion is what version holds, for the nodes' lag.
	stateVersion atomic.Uint64
}

// setVersion records the newest state version.
func (m *metrics) setVersion(v uint64) {
	m.version.Set(float64(v))
	m.stateVersion.Store(v)
}

func newMetrics(reg prometheus.Registerer, h *Hub) *metrics {
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
		encoded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_sync_encoded_bytes_total",
			Help: "Bytes of agents' services encoded: a step that many agents make alike (a change, a whole state at one version) is encoded once for them all, so this follows the changes, not the agents.",
		}),
	}
	for _, kind := range []string{"full", "resume", "delta"} {
		m.messages.WithLabelValues(kind) // at 0 from the start
	}
	current := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_server_current",
		Help: "1 while this server answers agents and speakers with the store's current state; 0 while it is not current (its store, or etcd, is away; its Kubernetes source has not listed the cluster yet) and sends them to another replica.",
	}, func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return bool01(h.notCurrent == "" && h.partial == "")
	})
	if reg != nil {
		reg.MustRegister(m.programming, m.nacks, m.connected, m.version, m.messages, m.bytes, m.encoded, nodeCollector{h}, current)
	}
	return m
}

// Per node: one series each, bounded by the nodes the cluster has.
var (
	nodeConnected = prometheus.NewDesc("weir_node_agent_connected",
		"1 when the node's agent has its state stream open (to this replica, or to another that published it), else 0.", []string{"node"}, nil)
	nodeLag = prometheus.NewDesc("weir_node_programmed_version_lag",
		"Store revisions between the newest state version and what the node's kernel holds of what concerns it: 0 when the node is programmed.", []string{"node"}, nil)
	nodeFailing = prometheus.NewDesc("weir_node_apply_failing",
		"1 while the node's agent refuses (NACKs) its newest state and forwards on the last one it applied, else 0.", []string{"node"}, nil)
)

// nodeCollector reads the nodes' status at each scrape.
type nodeCollector struct{ h *Hub }

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeConnected
	ch <- nodeLag
	ch <- nodeFailing
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	version := c.h.metrics.stateVersion.Load()
	// Read under the hub's lock, sent after it: the registry takes the
	// metrics from ch in the goroutine that also reads weir_server_current,
	// which takes the same lock, so a send under it waits for ever once ch
	// is full (a few hundred nodes), and with it every agent's answers.
	var metrics []prometheus.Metric
	c.h.eachStatus(func(n *observed.Node) {
		lag := uint64(0)
		if p := n.ProgrammedVersion(); p < version {
			lag = version - p
		}
		metrics = append(metrics,
			prometheus.MustNewConstMetric(nodeConnected, prometheus.GaugeValue, bool01(n.Connected), n.Node),
			prometheus.MustNewConstMetric(nodeLag, prometheus.GaugeValue, float64(lag), n.Node),
			prometheus.MustNewConstMetric(nodeFailing, prometheus.GaugeValue, bool01(n.LastError != ""), n.Node))
	})
	for _, m := range metrics {
		ch <- m
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
