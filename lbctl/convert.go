package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/weirlb/weir/lbctl/metallb"
)

func (a *app) convertCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "convert",
		Short: "Turn another load balancer's configuration into Weir's resources",
	}
	var files []string
	mlb := &cobra.Command{
		Use:   "metallb -f FILE",
		Short: "Turn MetalLB's resources into Weir's address pools and BGP peers",
		Long: `Turn MetalLB's resources (metallb.io IPAddressPool, BGPAdvertisement,
L2Advertisement, BGPPeer, Community; e.g. the output of
kubectl get ipaddresspools,bgpadvertisements,l2advertisements,bgppeers,communities -A -o yaml
split into documents, or the files they were applied from) into Weir's
AddressPool and BgpPeer documents, for lbctl apply -f or the resources
file. What Weir does not do as MetalLB did is listed at the top of the
output as comments, and on standard error: nothing is dropped silently.
Nothing is sent to the server.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if len(files) == 0 {
				return usageErrorf("no file given: use -f FILE (or -f - for standard input)")
			}
			var in strings.Builder
			for _, f := range files {
				data, err := a.readFile(f)
				if err != nil {
					return err
				}
				in.Write(data)
				in.WriteString("\n---\n")
			}
			r, err := metallb.Convert(in.String())
			if err != nil {
				return err
			}
			var docs []string
			for _, p := range r.Pools {
				k, _ := kindFor("addresspool")
				y, err := objectYAML(k, p)
				if err != nil {
					return err
				}
				docs = append(docs, y)
			}
			for _, p := range r.Peers {
				k, _ := kindFor("bgppeer")
				y, err := objectYAML(k, p)
				if err != nil {
					return err
				}
				docs = append(docs, y)
			}
			var head strings.Builder
			head.WriteString("# Converted from MetalLB by lbctl convert metallb.\n")
			if len(r.Notes) > 0 {
				head.WriteString("# What Weir does not do as MetalLB did:\n")
			}
			for _, n := range r.Notes {
				head.WriteString("# - " + n.String() + "\n")
				fmt.Fprintln(a.stderr, "note:", n.String())
			}
			fmt.Fprint(a.stdout, head.String()+strings.Join(docs, "---\n"))
			return nil
		},
	}
	mlb.Flags().StringArrayVarP(&files, "filename", "f", nil, `MetalLB YAML file ("-" for standard input); may repeat`)
	cmd.AddCommand(mlb)
	return cmd
}
