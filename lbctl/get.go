package main

import (
	"fmt"
	"slices"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var outputFormats = []string{"table", "wide", "json", "yaml"}

func (a *app) getCmd() *cobra.Command {
	var (
		allNamespaces bool
		selector      string
		output        string
	)
	cmd := &cobra.Command{
		Use:   "get TYPE [NAME]",
		Short: "List resources of one type, or show one",
		Long:  "List resources of one type, or show one.\n\nTypes: " + describeKinds() + ".",
		Example: `  lbctl get services
  lbctl get svc web -o yaml
  lbctl get eps -A -l app=web
  lbctl get nodes -o wide`,
		Args:      cobra.RangeArgs(1, 2),
		ValidArgs: plurals(),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := kindFor(args[0])
			if err != nil {
				return err
			}
			if !slices.Contains(outputFormats, output) {
				return usageErrorf("--output %q: want one of table, wide, json, yaml", output)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if len(args) == 2 {
				if allNamespaces || selector != "" {
					return usageErrorf("a NAME does not go with --all-namespaces or --selector")
				}
				obj, err := k.get(cmd.Context(), c, a.namespace, args[1])
				if status.Code(err) == codes.NotFound {
					return fmt.Errorf("%s %s not found", k.singular, k.ref(a.namespace, args[1]))
				}
				if err != nil {
					return plain(k, err)
				}
				return a.print(k, []object{obj}, output, true, false)
			}
			ns := a.namespace
			if allNamespaces || !k.namespaced {
				ns = ""
			}
			objs, err := k.list(cmd.Context(), c, ns, selector)
			if err != nil {
				return plain(k, err)
			}
			if len(objs) == 0 && (output == "table" || output == "wide") {
				// Like kubectl: tell a person, on stderr, rather than print a bare header.
				where := "."
				if ns != "" {
					where = " in namespace " + ns + "."
				}
				fmt.Fprintf(a.stderr, "No %s found%s\n", k.plural, where)
				return nil
			}
			return a.print(k, objs, output, false, allNamespaces && k.namespaced)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&a.namespace, "namespace", "n", "default", "namespace (ignored for nodes)")
	f.BoolVarP(&allNamespaces, "all-namespaces", "A", false, "list across all namespaces")
	f.StringVarP(&selector, "selector", "l", "", "label selector, e.g. app=web,tier!=cache")
	f.StringVarP(&output, "output", "o", "table", "output format: table, wide, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func plurals() []string {
	var out []string
	for _, k := range kinds {
		out = append(out, k.plural)
	}
	return out
}
