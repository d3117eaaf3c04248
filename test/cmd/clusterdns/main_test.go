package main

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// The names the e2e Service specs resolve, answered from Services and
// EndpointSlices as the Kubernetes DNS specification says.
func TestAnswersTheClusterNames(t *testing.T) {
	services := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	slices := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	services.Add(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"}}})
	services.Add(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: "ns"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.org"}})
	services.Add(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}})
	no, host := false, "db-0"
	slices.Add(&discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "db-1", Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: "db"}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, Hostname: &host},
			{Addresses: []string{"10.244.2.6"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
		},
	})
	r := &resolver{domain: "cluster.local.", services: listersv1.NewServiceLister(services), endpoints: discoverylisters.NewEndpointSliceLister(slices)}

	for _, c := range []struct {
		name  string
		qtype uint16
		want  []string // the records' values; nil: none
		found bool
	}{
		{"web.ns.svc.cluster.local.", dns.TypeA, []string{"10.96.0.20"}, true},
		{"web.ns.svc.cluster.local.", dns.TypeAAAA, nil, true},
		{"out.ns.svc.cluster.local.", dns.TypeA, []string{"example.org."}, true},
		{"db.ns.svc.cluster.local.", dns.TypeA, []string{"10.244.1.5"}, true}, // ready endpoints only
		{"db-0.db.ns.svc.cluster.local.", dns.TypeA, []string{"10.244.1.5"}, true},
		{"db-9.db.ns.svc.cluster.local.", dns.TypeA, nil, false},
		{"10-244-1-7.ns.pod.cluster.local.", dns.TypeA, []string{"10.244.1.7"}, true},
		{"nothing.ns.svc.cluster.local.", dns.TypeA, nil, false},
		{"ns.svc.cluster.local.", dns.TypeA, nil, true},
		{"foo.bar.cluster.local.", dns.TypeA, nil, false},
	} {
		rrs, found := r.answer(c.name, c.qtype)
		var got []string
		for _, rr := range rrs {
			switch v := rr.(type) {
			case *dns.A:
				a, _ := netip.AddrFromSlice(v.A)
				got = append(got, a.Unmap().String())
			case *dns.CNAME:
				got = append(got, v.Target)
			}
		}
		if found != c.found || len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) {
			t.Errorf("%s %s: %v (found %v), want %v (found %v)", c.name, dns.TypeToString[c.qtype], got, found, c.want, c.found)
		}
	}
}
