package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

var outputFormats = []string{"table", "wide", "json", "yaml"}

func (a *app) getCmd() *cobra.Command {
	var (
		allNamespaces bool
		selector      string
		output        string
		watch         bool
	)
	cmd := &cobra.Command{
		Use:   "get TYPE [NAME]",
		Short: "List resources of one type, or show one; --watch follows their changes",
		Long: `List resources of one type, or show one.

With --watch, print the current state, then every change as it happens,
until Ctrl-C: a table gets an EVENT column (ADDED, MODIFIED, DELETED) and a
row per event; json prints one object per line, yaml one document per
object.

Types: ` + describeKinds() + ".",
		Example: `  lbctl get services
  lbctl get svc web -o yaml
  lbctl get endpoints -A -l app=web
  lbctl get nodes -o wide
  lbctl get services --watch`,
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
			if len(args) == 2 && (allNamespaces || selector != "") {
				return usageErrorf("a NAME does not go with --all-namespaces or --selector")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ns := a.namespace
			if allNamespaces || !k.namespaced {
				ns = ""
			}
			withNamespace := allNamespaces && k.namespaced
			if watch {
				name := ""
				if len(args) == 2 {
					name = args[1]
				}
				return a.watch(cmd.Context(), k, c, ns, selector, name, output, withNamespace)
			}
			if len(args) == 2 {
				obj, err := a.getOne(cmd.Context(), k, c, a.namespace, args[1])
				if err != nil {
					return err
				}
				return a.print(k, []object{obj}, output, true, false)
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
			return a.print(k, objs, output, false, withNamespace)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&a.namespace, "namespace", "n", "default", "namespace (ignored for nodes)")
	f.BoolVarP(&allNamespaces, "all-namespaces", "A", false, "list across all namespaces")
	f.StringVarP(&selector, "selector", "l", "", "label selector, e.g. app=web,tier!=cache")
	f.StringVarP(&output, "output", "o", "table", "output format: table, wide, json or yaml")
	f.BoolVarP(&watch, "watch", "w", false, "after the current state, print every change until Ctrl-C")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// getOne fetches one resource, saying "not found" as kubectl does.
func (a *app) getOne(ctx context.Context, k *kind, c client, ns, name string) (object, error) {
	obj, err := k.get(ctx, c, ns, name)
	if err != nil {
		return nil, explain(k, k.ref(ns, name), err)
	}
	return obj, nil
}

// watch prints the current state, then every change, until ctx ends: on
// Ctrl-C, which is how a watch is meant to end, so not an error. name,
// when set, keeps only the resource of that name.
func (a *app) watch(ctx context.Context, k *kind, c client, ns, selector, name, format string, withNamespace bool) error {
	next, err := k.watch(ctx, c, ns, selector)
	if err != nil {
		return plain(k, err)
	}
	w := &watchPrinter{w: a.stdout, k: k, format: format}
	if format == "table" || format == "wide" {
		w.cols = a.columns(k, format == "wide", withNamespace)
		// EVENT as wide as its longest value from the start, so that the
		// first MODIFIED does not push its row out of line.
		w.table = &table{w: a.stdout, widths: []int{len("MODIFIED")}}
		w.table.add(append([]string{"EVENT"}, headers(w.cols)...)...)
	}
	synced := false
	for {
		typ, obj, err := next()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return plain(k, err)
		case typ == weirv1.WatchEventType_WATCH_EVENT_TYPE_SYNCED:
			synced = true
		case name == "" || obj.GetMetadata().GetName() == name:
			if err := w.add(typ, obj); err != nil {
				return err
			}
		}
		// The current state is one table, aligned as a whole; after it,
		// each change prints as it comes.
		if synced {
			if err := w.flush(); err != nil {
				return err
			}
		}
	}
}

// watchPrinter prints watch events: table rows behind an EVENT column, or
// each object as its own JSON line or YAML document.
type watchPrinter struct {
	w      io.Writer
	k      *kind
	format string
	cols   []column
	table  *table
	docs   int // YAML documents written: the ones after the first need "---"
}

func (p *watchPrinter) add(typ weirv1.WatchEventType, o object) error {
	var out string
	switch p.format {
	case "json":
		b, err := objectJSON(p.k, o)
		if err != nil {
			return err
		}
		out = string(b) + "\n"
	case "yaml":
		y, err := objectYAML(p.k, o)
		if err != nil {
			return err
		}
		if p.docs++; p.docs > 1 {
			y = "---\n" + y
		}
		out = y
	default:
		event := strings.TrimPrefix(typ.String(), "WATCH_EVENT_TYPE_")
		p.table.add(append([]string{event}, cells(p.cols, o)...)...)
		return nil
	}
	_, err := io.WriteString(p.w, out)
	return err
}

func (p *watchPrinter) flush() error {
	if p.table == nil {
		return nil
	}
	return p.table.flush()
}

func plurals() []string {
	var out []string
	for _, k := range kinds {
		out = append(out, k.plural)
	}
	return out
}
