package registry

import "github.com/weirlb/weir/server/model"

// A Keep decides what an update keeps of the object it replaces: the
// fields its writer leaves to Weir (status) or cannot read back (a
// password). It runs inside the update, under the registry's lock,
// against the object stored then (as Kubernetes' registry strategies run
// PrepareForUpdate inside the storage update), so what another writer
// wrote after the caller read the resource is kept, not written over. It
// returns the object to store, a copy when it keeps anything: the
// request itself is left as it came.
type Keep[T model.Object] func(now, old T) T

// KeepServiceStatus is what an update of a service's spec keeps: the
// addresses assigned and why none could be, as Kubernetes keeps status
// across spec updates, while the service stays a load balancer and the
// update names no addresses itself.
func KeepServiceStatus(now, old *model.Service) *model.Service {
	if len(now.LoadBalancerIPs) > 0 || now.Type != model.LoadBalancer {
		return now
	}
	c := *now
	c.LoadBalancerIPs, c.AddressReason, c.AddressMessage = old.LoadBalancerIPs, old.AddressReason, old.AddressMessage
	return &c
}

// KeepAddressReason is what an update that sets a service's
// status.load_balancer_ips keeps: its addresses stand, even none; the
// reason Weir assigned none is Weir's to keep.
func KeepAddressReason(now, old *model.Service) *model.Service {
	if now.Type != model.LoadBalancer {
		return now
	}
	c := *now
	c.AddressReason, c.AddressMessage = old.AddressReason, old.AddressMessage
	return &c
}

// KeepPeerPassword is what an update of a BGP peer keeps: the password,
// which is never read back, when the update leaves it out.
func KeepPeerPassword(now, old *model.BGPPeer) *model.BGPPeer {
	if now.Password != "" {
		return now
	}
	c := *now
	c.Password = old.Password
	return &c
}
