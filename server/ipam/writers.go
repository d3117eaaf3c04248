package ipam

import (
	"context"
	"net/netip"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/store"
)

// RegistryWriter writes assignments of natively declared services into the
// registry, as the service's status.
type RegistryWriter struct{ Registry *registry.Registry }

// WriteStatus updates the stored service's status, if it has not changed
// since it was read (the next round retries otherwise).
// With replicas, the write is made only while the leadership that ctx
// carries holds (store.WithGuard), so a replica that lost it assigns
// nothing more.
func (w RegistryWriter) WriteStatus(ctx context.Context, svc *model.Service, ips []netip.Addr, reason, message string) error {
	c := *svc
	c.LoadBalancerIPs, c.AddressReason, c.AddressMessage = ips, reason, message
	_, err := w.Registry.Services.UpdateGuarded(store.GuardOf(ctx), &c)
	return err
}
