package lab

import (
	"context"
	"strings"
)

// Route is `ip route show prefix` in ns, as text.
func Route(ctx context.Context, ns *Netns, prefix string) (string, error) {
	family := "-4"
	if strings.Contains(prefix, ":") {
		family = "-6"
	}
	return ns.Run(ctx, "ip", family, "route", "show", prefix)
}

// NextHops lists the next hops of prefix's kernel route in ns (one per ECMP
// path), whichever routing daemon installed it.
func NextHops(ctx context.Context, ns *Netns, prefix string) ([]string, error) {
	out, err := Route(ctx, ns, prefix)
	if err != nil {
		return nil, err
	}
	var hops []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "via" {
				hops = append(hops, f[i+1])
			}
		}
	}
	return hops, nil
}
