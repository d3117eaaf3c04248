package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/weirlb/weir/lbctl/convert"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func (a *app) convertCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "convert",
		Short: "Turn a configuration into Weir's resources, or into its Kubernetes custom resources",
	}
	var files []string
	var to, namespace string
	var allowDrops bool
	mlb := &cobra.Command{
		Use:   "metallb -f FILE",
		Short: "Turn MetalLB's resources into Weir's address pools and BGP peers",
		Long: fmt.Sprintf(`Turn MetalLB's resources (metallb.io IPAddressPool, BGPAdvertisement,
L2Advertisement, BGPPeer, Community, BFDProfile: the output of
kubectl get ipaddresspools.metallb.io,bgpadvertisements.metallb.io,l2advertisements.metallb.io,bgppeers.metallb.io,communities.metallb.io,bfdprofiles.metallb.io -n metallb-system -o yaml
as it is, a List, or the files they were applied from) into Weir's
address pools and BGP peers: lbctl's documents (--to resources, for lbctl
apply -f or a resources file) or Weir's Kubernetes custom resources (--to
crds, for kubectl apply -f; a peer's password becomes a Secret, its
passwordSecret the Secret it names).

Nothing is dropped silently: every field of the input is carried over or
named, object and field, in a note at the top of the output (as comments)
and on standard error, saying what to do instead in Weir; a field MetalLB
does not have is named too. (Metadata other than the name and labels, and
status, configure nothing, and are not carried over.) When something was not carried over whole,
the output is still written and the exit code is %d, so that a script
stops to read the notes; --allow-drops, once they are read, makes it 0.
Nothing is sent to the server.

The input is read strictly, never the last one winning: a field of the
wrong type is an error, a key said twice in one mapping is an error naming
it and its line, two objects of one kind with one name an error naming
both. It is at most %d MiB and %d documents in all.`, exitDropped, convert.MaxInputBytes>>20, convert.MaxDocuments),
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := checkTo(to); err != nil {
				return err
			}
			if len(files) == 0 {
				return usageErrorf("no file given: use -f FILE (or -f - for standard input)")
			}
			in, err := a.readStream(files, convert.MaxInputBytes)
			if err != nil {
				return err
			}
			r, err := convert.Convert(in, convert.Options{CustomResources: to == "crds", Namespace: namespace})
			if err != nil {
				return err
			}
			if err := a.printConverted("MetalLB", "lbctl convert metallb", r, to, namespace); err != nil {
				return err
			}
			if r.Lossy() && !allowDrops {
				return &droppedError{}
			}
			return nil
		},
	}
	mlb.Flags().StringArrayVarP(&files, "filename", "f", nil, `MetalLB YAML file ("-" for standard input); may repeat`)
	mlb.Flags().StringVar(&to, "to", "resources", "resources (lbctl's documents) or crds (weir.dev custom resources)")
	mlb.Flags().StringVar(&namespace, "namespace", "weir-system", "with --to crds: the server's namespace, where password Secrets go")
	mlb.Flags().BoolVar(&allowDrops, "allow-drops", false, fmt.Sprintf("exit 0, not %d, when the notes say something was not carried over whole", exitDropped))

	var rfiles []string
	var rnamespace string
	res := &cobra.Command{
		Use:   "resources -f FILE",
		Short: "Turn lbctl's address pools and BGP peers into Weir's Kubernetes custom resources",
		Long: `Turn the AddressPool and BgpPeer documents of lbctl's YAML (a resources
file, such as the weir-resources ConfigMap's resources.yaml) into Weir's
Kubernetes custom resources (weir.dev/v1alpha1 WeirAddressPool and
WeirBGPPeer), for kubectl apply -f: the
move from the ConfigMap to custom resources. A peer's password becomes a
Secret in --namespace. Other kinds are listed as left out. Nothing is sent
to the server.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			docs, err := a.readDocuments(rfiles)
			if err != nil {
				return err
			}
			r := &convert.Result{}
			for _, d := range docs {
				switch o := d.obj.(type) {
				case *weirv1.AddressPool:
					r.Pools = append(r.Pools, o)
				case *weirv1.BgpPeer:
					r.Peers = append(r.Peers, o)
				default:
					r.Notes = append(r.Notes, convert.Note{Object: d.path(), Says: "not a pool or a peer: left out (in a cluster, Kubernetes has it)"})
				}
			}
			return a.printConverted("lbctl's resources", "lbctl convert resources", r, "crds", rnamespace)
		},
	}
	res.Flags().StringArrayVarP(&rfiles, "filename", "f", nil, `lbctl YAML file ("-" for standard input); may repeat`)
	res.Flags().StringVar(&rnamespace, "namespace", "weir-system", "the server's namespace, where password Secrets go")
	cmd.AddCommand(mlb, res)
	return cmd
}

// readStream reads files one after the other as one YAML stream, and no
// more than limit bytes of them: past it, an error.
func (a *app) readStream(files []string, limit int) (string, error) {
	var in strings.Builder
	for _, file := range files {
		f, err := a.open(file)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(&in, io.LimitReader(f, int64(limit-in.Len()+1)))
		f.Close()
		if err != nil {
			return "", fmt.Errorf("%s: %w", file, err)
		}
		in.WriteString("\n---\n")
		if in.Len() > limit {
			return "", fmt.Errorf("%s: more than %d MiB in all: %w", file, limit>>20, convert.ErrTooLarge)
		}
	}
	return in.String(), nil
}

func checkTo(to string) error {
	if to != "resources" && to != "crds" {
		return usageErrorf("--to %q: want resources or crds", to)
	}
	return nil
}

// printConverted writes r as lbctl's documents or as custom resources,
// its notes first as comments, and on standard error.
func (a *app) printConverted(from, by string, r *convert.Result, to, namespace string) error {
	var body string
	if to == "crds" {
		var err error
		if body, err = r.CustomResources(namespace); err != nil {
			return err
		}
	} else {
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
		body = strings.Join(docs, "---\n")
	}
	var head strings.Builder
	fmt.Fprintf(&head, "# Converted from %s by %s.\n", from, by)
	if len(r.Notes) > 0 {
		head.WriteString("# What Weir does not do as it was:\n")
	}
	for _, n := range r.Notes {
		head.WriteString("# - " + n.String() + "\n")
		fmt.Fprintln(a.stderr, "note:", n.String())
	}
	_, err := fmt.Fprint(a.stdout, head.String()+body)
	return err
}

// exitDropped is convert metallb's exit code when the output is written
// but something of the input was not carried over whole (its notes say
// what): distinct from an error (1), a usage error (2) and a server that
// could not be reached (3).
const exitDropped = 5

// droppedError is convert metallb's output written with losses; the
// notes, on standard error already, say which.
type droppedError struct{}

func (*droppedError) Error() string {
	return "not everything was carried over: read the notes, then convert again with --allow-drops to accept them"
}
