// Package routeradv makes a node known on the links of its unnumbered
// BGP sessions: it sends IPv6 router advertisements there, as routers
// running unnumbered BGP do, because such a router (FRR's "neighbor IFACE
// interface") learns its neighbour's link-local address from them and
// neither dials nor accepts a session before it has. The advertisements
// say a router lifetime of 0, so no host on the link takes the node for
// a default router, and carry no prefix.
package routeradv

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mdlayher/ndp"
	"golang.org/x/net/ipv6"
)

// Interval is the time between two advertisements on a link.
var Interval = 3 * time.Second

// Advertiser sends router advertisements on the links it is set to.
type Advertiser struct {
	log *slog.Logger

	mu    sync.Mutex
	links map[string]context.CancelFunc
	wg    sync.WaitGroup
}

// New returns an Advertiser on no link.
func New(log *slog.Logger) *Advertiser {
	return &Advertiser{log: log, links: map[string]context.CancelFunc{}}
}

// Set makes the links named (network interfaces) the ones advertised on,
// starting on the new ones at once and stopping on the others.
func (a *Advertiser) Set(links []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, stop := range a.links {
		if !slices.Contains(links, name) {
			stop()
			delete(a.links, name)
		}
	}
	for _, name := range links {
		if _, ok := a.links[name]; ok || name == "" {
			continue
		}
		ctx, stop := context.WithCancel(context.Background())
		a.links[name] = stop
		a.wg.Go(func() { a.advertise(ctx, name) })
	}
}

// Close stops every link's advertisements and waits for them to end.
func (a *Advertiser) Close() {
	a.Set(nil)
	a.wg.Wait()
}

// advertise sends on link until ctx ends. A link that is missing or has
// no link-local address yet is tried again every Interval; an error is
// logged when it starts and when it ends, not each time.
func (a *Advertiser) advertise(ctx context.Context, link string) {
	var conn *ndp.Conn
	var ra *ndp.RouterAdvertisement
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	failing := ""
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		var err error
		if conn == nil {
			conn, ra, err = listen(link)
		}
		if err == nil {
			if err = conn.WriteTo(ra, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
				conn.Close()
				conn = nil // the link may have gone: find it again
			}
		}
		switch {
		case err != nil && failing == "":
			a.log.Warn("router advertisements not sent; trying again", "interface", link, "error", err)
			failing = err.Error()
		case err == nil && failing != "":
			a.log.Info("router advertisements sent again", "interface", link)
			failing = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// listen opens link's NDP socket from its link-local address, receiving
// nothing (the advertiser only sends), and returns it with the
// advertisement to send there: a router lifetime of 0 and the link's
// hardware address.
func listen(link string) (*ndp.Conn, *ndp.RouterAdvertisement, error) {
	ifi, err := net.InterfaceByName(link)
	if err != nil {
		return nil, nil, err
	}
	conn, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, nil, err
	}
	var none ipv6.ICMPFilter
	none.SetAll(true)
	if err := conn.SetICMPFilter(&none); err != nil {
		conn.Close()
		return nil, nil, err
	}
	ra := &ndp.RouterAdvertisement{RouterSelectionPreference: ndp.Medium}
	if len(ifi.HardwareAddr) > 0 {
		ra.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}}
	}
	return conn, ra, nil
}
