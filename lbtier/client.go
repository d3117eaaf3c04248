package lbtier

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"google.golang.org/grpc"

	"github.com/weirlb/weir/internal/dial"
	"github.com/weirlb/weir/internal/nodewire"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// Follow feeds s the server's targets until ctx ends, reconnecting (to
// the next replica when conn is one of several, *dial.Servers, then with
// backoff); while the server is away s keeps its last targets (and the
// routers their paths), as agents keep their rules.
func Follow(ctx context.Context, conn grpc.ClientConnInterface, s *Speaker, log *slog.Logger) {
	// Capped at a second: back soon after the server returns.
	retry := dial.NewReconnect(conn, time.Second)
	client := weirv1.NewLoadBalancerTierServiceClient(conn)
	for ctx.Err() == nil {
		server := retry.Server()
		gotTargets, err := follow(ctx, client, s, server, retry.AcceptStale(), retry.WaitForReady())
		if ctx.Err() != nil {
			return
		}
		wait := retry.Ended(err, gotTargets)
		log.Warn("targets stream ended; keeping the last targets", "server", server, "error", err, "next", retry.Server(), "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// follow runs one watch on server (the replica conn is on, or "");
// gotTargets reports whether the server sent any.
func follow(ctx context.Context, client weirv1.LoadBalancerTierServiceClient, s *Speaker, server string, acceptStale, waitForReady bool) (gotTargets bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// WaitForReady with one server: back as soon as it is (see agent/syncer).
	stream, err := client.WatchTargets(ctx, &weirv1.WatchTargetsRequest{Speaker: s.cfg.Name, AcceptStale: acceptStale}, grpc.WaitForReady(waitForReady))
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return gotTargets, err
		}
		if !gotTargets {
			// A new watch: the server (maybe another replica) forgot the
			// last report. Reports go over conn, to this same replica.
			s.cfg.Log.Info("following targets from server", "server", server, "accept_stale", acceptStale)
			s.resendStatus()
			gotTargets = true
		}
		s.SetTargets(TargetsFromProto(resp.GetVips(), s.cfg.Log), resp.GetRevision())
	}
}

// TargetsFromProto reads the server's targets, skipping (and logging) any
// that do not parse.
func TargetsFromProto(vips []*weirv1.VipTargets, log *slog.Logger) []Target {
	var out []Target
	for _, v := range vips {
		vip, err := netip.ParseAddr(v.GetAddress())
		bits := int(v.GetPrefixLength())
		if bits == 0 {
			bits = vip.BitLen()
		}
		if err != nil || bits > vip.BitLen() {
			log.Error("skipping a load-balancer IP that does not parse", "address", v.GetAddress(), "prefix_length", v.GetPrefixLength())
			continue
		}
		prefix := netip.PrefixFrom(vip, bits).Masked()
		large := nodewire.DecodeLargeCommunities(v.GetLargeCommunities())
		for _, t := range v.GetTargets() {
			hop, err := netip.ParseAddr(t.GetAddress())
			if err != nil || hop.Is6() != vip.Is6() || t.GetHealthCheckPort() <= 0 || t.GetHealthCheckPort() > 65535 {
				log.Error("skipping a target that does not parse", "vip", vip, "node", t.GetNode(), "address", t.GetAddress())
				continue
			}
			out = append(out, Target{
				VIP: vip, Prefix: prefix, Service: v.GetService(), Node: t.GetNode(), NextHop: hop, Weight: t.GetWeight(),
				Probe:       ProbeKey{Addr: hop, Port: uint16(t.GetHealthCheckPort()), Path: t.GetHealthCheckPath()},
				Communities: v.GetCommunities(), LargeCommunities: large, LocalPref: v.GetLocalPreference(),
			})
		}
	}
	return out
}

// Reporter sends a speaker's statuses to the server.
func Reporter(client weirv1.LoadBalancerTierServiceClient, log *slog.Logger) func(*weirv1.SpeakerStatus) error {
	return func(st *weirv1.SpeakerStatus) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := client.ReportSpeaker(ctx, &weirv1.ReportSpeakerRequest{Status: st})
		if err != nil {
			log.Debug("reporting to the server failed; sent again in a second", "error", err)
		}
		return err
	}
}
