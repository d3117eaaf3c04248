package e2e

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/test/lab"
	"github.com/weirlb/weir/test/weirlab"
)

// expectRefused asserts a quick, active refusal (ICMP or TCP reset).
func expectRefused(t *testing.T, ns *lab.Netns, dst netip.AddrPort) {
	t.Helper()
	eventually(t, "connection to "+dst.String()+" is refused", func() error {
		start := time.Now()
		_, err := weirlab.Get(context.Background(), ns, dst)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return errors.New("got " + errString(err) + ", want connection refused")
		}
		if d := time.Since(start); d > time.Second {
			return errors.New("refusal took " + d.String())
		}
		return nil
	})
}

// TestFamiliesAreProgrammedIndependently: a dual-stack service whose
// endpoints are all IPv4 works on its IPv4 cluster IP and refuses on its
// IPv6 one; a port the service does not have is refused on both.
func TestFamiliesAreProgrammedIndependently(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	svc := lbService("v4only", 30093, []string{"10.96.0.24", "fd00:96::24"}, nil)
	svc.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_NODE_PORT
	svc.Status = nil
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	v4 := endpointSlices("v4only", c.Pods())[0]
	if _, err := c.Registry.CreateEndpointSlice(ctx, &weirv1.CreateEndpointSliceRequest{EndpointSlice: v4}); err != nil {
		t.Fatal(err)
	}
	client := c.Nodes[0].Pods[1].Netns
	v4dst := netip.MustParseAddrPort("10.96.0.24:80")
	eventually(t, "the IPv4 cluster IP answers", func() error {
		_, err := weirlab.Get(ctx, client, v4dst)
		return err
	})
	expectRefused(t, client, netip.MustParseAddrPort("[fd00:96::24]:80"))
	expectRefused(t, c.Client, netip.AddrPortFrom(c.Nodes[0].IPv6, 30093))
	sample(t, c.Client, netip.AddrPortFrom(c.Nodes[0].IPv4, 30093), 3)
	// Wrong port on an allocated cluster IP: refused, in both families.
	expectRefused(t, client, netip.MustParseAddrPort("10.96.0.24:81"))
	expectRefused(t, client, netip.MustParseAddrPort("[fd00:96::24]:81"))
}

// TestExternalIPs: a service's external IPs forward like its other
// frontends, in both families, from the ranges the operator allows; one
// that would take another service's cluster IP (CVE-2020-8554's pattern)
// or come from elsewhere is refused, and the cluster IP keeps forwarding
// to its own pods.
func TestExternalIPs(t *testing.T) {
	c := startClusterWith(t, func(c *weirlab.Cluster) {
		c.ServerArgs = []string{"--allowed-external-ip-cidrs", "203.0.113.0/24,2001:db8:113::/48,10.96.0.0/16"}
	})
	ctx := context.Background()
	svc := clusterIPService("ext", "10.96.0.26", "fd00:96::26")
	svc.Spec.ExternalIps = []string{"203.0.113.26", "2001:db8:113::26"}
	createService(t, c, svc, c.Pods())
	hijack := clusterIPService("hijack", "10.96.0.27")
	hijack.Metadata.Namespace = "other"
	hijack.Spec.ExternalIps = []string{"10.96.0.26"}
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: hijack}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a service whose external IP is another's cluster IP: %v; want it refused", err)
	} else if !strings.Contains(err.Error(), "spec.external_ips[0]") || !strings.Contains(err.Error(), "default/ext") {
		t.Errorf("refusal %q does not name the field and the service holding it", err)
	}
	outside := clusterIPService("outside", "10.96.0.28")
	outside.Spec.ExternalIps = []string{"198.51.100.28"}
	if _, err := c.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: outside}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "spec.external_ips[0]") {
		t.Errorf("an external IP outside the allowed CIDRs: %v; want InvalidArgument naming spec.external_ips[0]", err)
	}
	if _, err := c.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "other", Name: "hijack"}); status.Code(err) != codes.NotFound {
		t.Errorf("the refused service was stored: %v", err)
	}
	seen := map[string]bool{}
	for _, r := range sample(t, c.Nodes[0].Pods[0].Netns, netip.MustParseAddrPort("10.96.0.26:80"), 30) {
		seen[r.Pod] = true
	}
	if len(seen) != 3 {
		t.Errorf("the cluster IP reached %v; want its own 3 pods", seen)
	}
	for _, fam := range families("10.96.0.26", "fd00:96::26", "203.0.113.26", "2001:db8:113::26") {
		t.Run(fam.name, func(t *testing.T) {
			routeVIP(t, c, fam.lbIP, fam.routePrefix, fam.node(c.Nodes[0]))
			dst := netip.AddrPortFrom(fam.lbIP, 80)
			eventually(t, "the external IP answers", func() error {
				_, err := weirlab.Get(context.Background(), c.Client, dst)
				return err
			})
			seen := map[string]bool{}
			for _, r := range sample(t, c.Client, dst, 30) {
				seen[r.Pod] = true
			}
			if len(seen) != 3 {
				t.Errorf("30 connections to the external IP reached %v; want all 3 pods", seen)
			}
		})
	}
}
