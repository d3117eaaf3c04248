// Command clusterdns is the lab cluster's DNS (test/kubecluster), for
// Kubernetes' own e2e tests, which reach Services by name. It answers the
// names of the Kubernetes DNS specification a Service test needs, from the
// apiserver's Services and EndpointSlices:
//
//	<service>.<namespace>.svc.<domain>            A/AAAA: the cluster IPs;
//	                                              a headless Service's ready endpoints;
//	                                              an ExternalName Service: a CNAME
//	<hostname>.<service>.<namespace>.svc.<domain> A/AAAA: that endpoint (headless)
//	<a-b-c-d>.<namespace>.pod.<domain>             A: the address the name spells
//
// over UDP and TCP. A name in the domain that names nothing is NXDOMAIN;
// any other is REFUSED: the lab has no upstream resolver.
package main

import (
	"context"
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
)

// ttl is every answer's TTL: short, as the tests change Services under
// their names.
const ttl = 5

func main() {
	listen := flag.String("listen", ":53", "address to answer on, UDP and TCP")
	domain := flag.String("domain", "cluster.local", "the cluster's domain")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Error("in-cluster configuration", "err", err)
		os.Exit(1)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Error("client", "err", err)
		os.Exit(1)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	r := &resolver{
		domain:    dns.Fqdn(*domain),
		services:  factory.Core().V1().Services().Lister(),
		endpoints: factory.Discovery().V1().EndpointSlices().Lister(),
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			log.Error("cache not synced", "type", typ)
			os.Exit(1)
		}
	}
	for _, network := range []string{"udp", "tcp"} {
		srv := &dns.Server{Addr: *listen, Net: network, Handler: r}
		go func() {
			if err := srv.ListenAndServe(); err != nil {
				log.Error("serve", "net", network, "err", err)
				os.Exit(1)
			}
		}()
		defer srv.Shutdown()
	}
	log.Info("answering", "listen", *listen, "domain", *domain)
	<-ctx.Done()
}

type resolver struct {
	domain    string // fully qualified: "cluster.local."
	services  listersv1.ServiceLister
	endpoints discoverylisters.EndpointSliceLister
}

func (r *resolver) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if !dns.IsSubDomain(r.domain, name) {
		m.Authoritative = false
		m.Rcode = dns.RcodeRefused
		w.WriteMsg(m)
		return
	}
	answers, found := r.answer(name, q.Qtype)
	m.Answer = answers
	if !found {
		m.Rcode = dns.RcodeNameError
	}
	w.WriteMsg(m)
}

// answer gives the records of name of type qtype, and whether the name
// exists at all (a name with no record of that type is NOERROR, empty).
func (r *resolver) answer(name string, qtype uint16) ([]dns.RR, bool) {
	parts := dns.SplitDomainName(strings.TrimSuffix(name, r.domain))
	switch {
	case len(parts) == 3 && parts[2] == "pod":
		addr, err := netip.ParseAddr(strings.ReplaceAll(parts[0], "-", "."))
		if err != nil {
			return nil, false
		}
		return addressRecords(name, qtype, []netip.Addr{addr}), true
	case len(parts) == 3 && parts[2] == "svc":
		return r.service(name, qtype, parts[1], parts[0], "")
	case len(parts) == 4 && parts[3] == "svc":
		return r.service(name, qtype, parts[2], parts[1], parts[0])
	case len(parts) == 0, len(parts) <= 2 && (parts[len(parts)-1] == "svc" || parts[len(parts)-1] == "pod"):
		// The domain itself, svc.<domain>, <namespace>.svc.<domain>: names
		// that hold others.
		return nil, true
	}
	return nil, false
}

// service answers for a Service, or for the endpoint of a headless one
// whose hostname is host.
func (r *resolver) service(name string, qtype uint16, namespace, service, host string) ([]dns.RR, bool) {
	svc, err := r.services.Services(namespace).Get(service)
	if err != nil {
		return nil, false
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		if host != "" {
			return nil, false
		}
		target := dns.Fqdn(svc.Spec.ExternalName)
		return []dns.RR{&dns.CNAME{Hdr: header(name, dns.TypeCNAME), Target: target}}, true
	}
	headless := svc.Spec.ClusterIP == corev1.ClusterIPNone
	if !headless {
		if host != "" {
			return nil, false
		}
		var addrs []netip.Addr
		for _, ip := range svc.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				addrs = append(addrs, a)
			}
		}
		return addressRecords(name, qtype, addrs), true
	}
	slices, err := r.endpoints.EndpointSlices(namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service}))
	if err != nil {
		return nil, false
	}
	var addrs []netip.Addr
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready || svc.Spec.PublishNotReadyAddresses
			if !ready || (host != "" && (ep.Hostname == nil || *ep.Hostname != host)) {
				continue
			}
			for _, ip := range ep.Addresses {
				if a, err := netip.ParseAddr(ip); err == nil {
					addrs = append(addrs, a)
				}
			}
		}
	}
	if host != "" && len(addrs) == 0 {
		return nil, false
	}
	return addressRecords(name, qtype, addrs), true
}

// addressRecords are the A (or AAAA) records of addrs that qtype asks for.
func addressRecords(name string, qtype uint16, addrs []netip.Addr) []dns.RR {
	var rrs []dns.RR
	for _, a := range addrs {
		switch {
		case a.Is4() && (qtype == dns.TypeA || qtype == dns.TypeANY):
			rrs = append(rrs, &dns.A{Hdr: header(name, dns.TypeA), A: a.AsSlice()})
		case a.Is6() && (qtype == dns.TypeAAAA || qtype == dns.TypeANY):
			rrs = append(rrs, &dns.AAAA{Hdr: header(name, dns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	return rrs
}

func header(name string, typ uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: typ, Class: dns.ClassINET, Ttl: ttl}
}
