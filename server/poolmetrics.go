package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirlb/weir/server/ipam"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
)

// Per pool and family, as MetalLB's allocator metrics: bounded by the
// pools an operator declares.
var (
	poolSize = prometheus.NewDesc("weir_address_pool_addresses",
		"Addresses an address pool holds, by family (at most 2^63-1: a large IPv6 pool counts as that).", []string{"pool", "family"}, nil)
	poolInUse = prometheus.NewDesc("weir_address_pool_addresses_in_use",
		"Addresses of an address pool that services hold as load-balancer IPs, by family (an address shared by several services counts once).", []string{"pool", "family"}, nil)
)

// poolCollector counts the pools' addresses at each scrape.
type poolCollector struct{ reg *registry.Registry }

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolSize
	ch <- poolInUse
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	// Sent after the registry's lock, never under it: a send waits while
	// the registry's reader of ch is busy, and a write waiting for the
	// lock would hold up every other reader meanwhile.
	var metrics []prometheus.Metric
	defer func() {
		for _, m := range metrics {
			ch <- m
		}
	}()
	c.reg.Read(func(v registry.View) {
		var services []*model.Service
		for _, key := range v.LoadBalancerServiceKeys() {
			services = append(services, v.Service(key))
		}
		for _, p := range v.Pools() {
			u := ipam.UsageOf(p, services)
			var has4, has6 bool
			for _, r := range p.Ranges {
				has4, has6 = has4 || r.First.Is4(), has6 || !r.First.Is4()
			}
			if has4 {
				metrics = append(metrics,
					prometheus.MustNewConstMetric(poolSize, prometheus.GaugeValue, float64(u.AssignedIPv4)+float64(u.AvailableIPv4), p.Name, "IPv4"),
					prometheus.MustNewConstMetric(poolInUse, prometheus.GaugeValue, float64(u.AssignedIPv4), p.Name, "IPv4"))
			}
			if has6 {
				metrics = append(metrics,
					prometheus.MustNewConstMetric(poolSize, prometheus.GaugeValue, float64(u.AssignedIPv6)+float64(u.AvailableIPv6), p.Name, "IPv6"),
					prometheus.MustNewConstMetric(poolInUse, prometheus.GaugeValue, float64(u.AssignedIPv6), p.Name, "IPv6"))
			}
		}
	})
}
