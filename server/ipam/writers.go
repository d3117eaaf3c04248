package ipam

import (
	"context"
	"net/netip"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
)

// RegistryWriter writes assignments of natively declared services into the
// registry, as the service's status.
type RegistryWriter struct{ Registry *registry.Registry }

// WriteStatus updates the stored service's status, if it has not changed
// since it was read (the next round retries otherwise).
func (w RegistryWriter) WriteStatus(_ context.Context, svc *model.Service, ips []netip.Addr, reason, message string) error {
	c := *svc
	c.LoadBalancerIPs, c.AddressReason, c.AddressMessage = ips, reason, message
	_, err := w.Registry.Services.Update(&c)
	return err
}
