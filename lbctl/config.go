package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

const (
	defaultServer     = "127.0.0.1:7443"
	defaultConfigHint = "$XDG_CONFIG_HOME/weir/lbctl.yaml or ~/.config/weir/lbctl.yaml"
)

// config is the file of contexts: named servers with the way to reach
// each, one of them current, in the manner of a kubeconfig.
type config struct {
	CurrentContext string        `json:"current-context,omitempty"`
	Contexts       []contextSpec `json:"contexts"`
}

// contextSpec is one server (Server may list its replicas,
// comma-separated) and how to reach it. Relative file names are relative
// to the config file's folder.
type contextSpec struct {
	Name     string `json:"name"`
	Server   string `json:"server,omitempty"`
	CAFile   string `json:"ca-file,omitempty"`
	CertFile string `json:"cert-file,omitempty"`
	KeyFile  string `json:"key-file,omitempty"`
	Insecure bool   `json:"insecure,omitempty"`
}

// configPath is --config, else LBCTL_CONFIG, else the user's config folder.
func (a *app) configPath() (string, error) {
	if a.configFile != "" {
		return a.configFile, nil
	}
	if p := os.Getenv("LBCTL_CONFIG"); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir() // $XDG_CONFIG_HOME, or ~/.config
	if err != nil {
		return "", fmt.Errorf("no config file: %v (set --config or LBCTL_CONFIG)", err)
	}
	return filepath.Join(dir, "weir", "lbctl.yaml"), nil
}

// loadConfig reads the config file; a missing one is an empty config.
func (a *app) loadConfig() (*config, string, error) {
	path, err := a.configPath()
	if err != nil {
		return nil, "", err
	}
	cfg := &config{}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, path, nil
	}
	if err != nil {
		return nil, "", err
	}
	// Strict, so that a misspelt key is an error rather than a silent default.
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return nil, "", fmt.Errorf("config file %s: %v", path, err)
	}
	seen := map[string]bool{}
	for i, c := range cfg.Contexts {
		switch {
		case c.Name == "":
			return nil, "", fmt.Errorf("config file %s: contexts[%d]: no name", path, i)
		case seen[c.Name]:
			return nil, "", fmt.Errorf("config file %s: contexts[%d]: a second context named %q", path, i, c.Name)
		}
		seen[c.Name] = true
	}
	return cfg, path, nil
}

// find returns the context named name, or nil.
func (c *config) find(name string) *contextSpec {
	for i := range c.Contexts {
		if c.Contexts[i].Name == name {
			return &c.Contexts[i]
		}
	}
	return nil
}

// save writes the file whole, readable by its owner only since it names
// key files, and through a rename so that a failure leaves the old one.
func (c *config) save(path string) error {
	data, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".lbctl-*.yaml") // mode 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// resolveConnection settles the server and the transport: each setting
// from its flag when given, else from the environment, else from the
// context (--context, or the file's current one), else the default.
func (a *app) resolveConnection() error {
	cfg, path, err := a.loadConfig()
	if err != nil {
		return err
	}
	name := a.contextName
	if name == "" {
		name = cfg.CurrentContext
	}
	cur := &contextSpec{}
	if name != "" {
		if cur = cfg.find(name); cur == nil {
			if a.contextName != "" {
				return usageErrorf("--context %q: no such context in %s", name, path)
			}
			return fmt.Errorf("config file %s: current-context %q is not among its contexts", path, name)
		}
	}

	if !a.flags.Changed("server") {
		a.server = cmp.Or(os.Getenv("WEIR_SERVER"), cur.Server, defaultServer)
	}
	if !a.flags.Changed("insecure") {
		a.insecure = cur.Insecure
		if v := os.Getenv("WEIR_INSECURE"); v != "" {
			if a.insecure, err = strconv.ParseBool(v); err != nil {
				return usageErrorf("WEIR_INSECURE=%q: want 1 or 0", v)
			}
		}
	}
	tlsFlags := a.flags.Changed("ca-file") || a.flags.Changed("cert-file") || a.flags.Changed("key-file")
	if a.insecure {
		if tlsFlags {
			return usageErrorf("--insecure (or WEIR_INSECURE=1, or an insecure context) does not go with --ca-file, --cert-file or --key-file")
		}
		return nil // a plain-text context's files, if any, are not used
	}
	dir := filepath.Dir(path)
	for _, f := range []struct {
		flag string
		dst  *string
		cur  string
	}{{"ca-file", &a.tls.CA, cur.CAFile}, {"cert-file", &a.tls.Cert, cur.CertFile}, {"key-file", &a.tls.Key, cur.KeyFile}} {
		if !a.flags.Changed(f.flag) && f.cur != "" {
			*f.dst = f.cur
			if !filepath.IsAbs(f.cur) {
				*f.dst = filepath.Join(dir, f.cur)
			}
		}
	}
	return nil
}

func (a *app) configCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Show and change the contexts of the config file",
		Long: `Show and change the contexts of the config file (--config, env
LBCTL_CONFIG, or ` + defaultConfigHint + `).

A context names a server and how to reach it (server may list several
replicas, comma-separated: lbctl uses the first that answers):

  current-context: lab
  contexts:
  - name: lab
    server: 192.0.2.2:7443
    ca-file: /etc/weir/tls/ca.crt
    cert-file: /etc/weir/tls/admin.crt
    key-file: /etc/weir/tls/admin.key
    insecure: false

lbctl uses --context, else current-context. Flags override the context,
and so do WEIR_SERVER and WEIR_INSECURE. Rewriting the file drops its
comments.`,
	}
	cmd.AddCommand(a.getContextsCmd(), a.useContextCmd(), a.setContextCmd())
	return cmd
}

func (a *app) getContextsCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get-contexts",
		Short: "List the contexts; * marks the current one (-o json|yaml: the config file's content)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cfg, path, err := a.loadConfig()
			if err != nil {
				return err
			}
			if output != "table" {
				if cfg.Contexts == nil {
					cfg.Contexts = []contextSpec{}
				}
				b, err := json.MarshalIndent(cfg, "", "  ")
				if err != nil {
					return err
				}
				return a.printDocument(b, output)
			}
			if len(cfg.Contexts) == 0 {
				fmt.Fprintf(a.stderr, "No contexts in %s.\n", path)
				return nil
			}
			t := &table{w: a.stdout}
			t.add("CURRENT", "NAME", "SERVER", "INSECURE", "CERT-FILE")
			for _, c := range cfg.Contexts {
				current := ""
				if c.Name == cfg.CurrentContext {
					current = "*"
				}
				t.add(current, c.Name, orNone(c.Server), yesNo(c.Insecure), orNone(c.CertFile))
			}
			return t.flush()
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func (a *app) useContextCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "use-context NAME",
		Short:             "Make a context the current one",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeContexts,
		RunE: func(_ *cobra.Command, args []string) error {
			return a.editConfig(func(cfg *config, path string) (string, error) {
				if cfg.find(args[0]) == nil {
					return "", fmt.Errorf("no context %q in %s", args[0], path)
				}
				cfg.CurrentContext = args[0]
				return fmt.Sprintf("Switched to context %q.", args[0]), nil
			})
		},
	}
}

func (a *app) setContextCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "set-context NAME [--server ADDR[,ADDR...]] [--ca-file FILE] [--cert-file FILE] [--key-file FILE] [--insecure]",
		Short: "Create a context, or change the settings given of an existing one",
		Example: `  lbctl config set-context lab --server 192.0.2.2:7443 --ca-file ca.crt --cert-file admin.crt --key-file admin.key
  lbctl config set-context demo --server 127.0.0.1:7443 --insecure
  lbctl config set-context prod --server weir-1.example:7443,weir-2.example:7443,weir-3.example:7443 --ca-file ca.crt
  lbctl config use-context lab`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeContexts,
		RunE: func(_ *cobra.Command, args []string) error {
			return a.editConfig(func(cfg *config, _ string) (string, error) {
				verb := "modified"
				c := cfg.find(args[0])
				if c == nil {
					cfg.Contexts = append(cfg.Contexts, contextSpec{Name: args[0]})
					c, verb = &cfg.Contexts[len(cfg.Contexts)-1], "created"
				}
				// The global flags given are the settings to change.
				if a.flags.Changed("server") {
					c.Server = a.server
				}
				if a.flags.Changed("insecure") {
					c.Insecure = a.insecure
				}
				for _, f := range []struct {
					flag string
					dst  *string
					val  string
				}{{"ca-file", &c.CAFile, a.tls.CA}, {"cert-file", &c.CertFile, a.tls.Cert}, {"key-file", &c.KeyFile, a.tls.Key}} {
					var err error
					switch {
					case !a.flags.Changed(f.flag):
					case f.val == "": // --ca-file "" removes the setting
						*f.dst = ""
					default:
						// Absolute, so that the file means the same from any folder.
						if *f.dst, err = filepath.Abs(f.val); err != nil {
							return "", err
						}
					}
				}
				if c.Insecure && (c.CAFile != "" || c.CertFile != "" || c.KeyFile != "") {
					return "", usageErrorf("context %q: insecure does not go with ca-file, cert-file or key-file", c.Name)
				}
				return fmt.Sprintf("Context %q %s.", c.Name, verb), nil
			})
		},
	}
}

// editConfig loads the config file, lets edit change it, saves it and
// prints what edit says was done.
func (a *app) editConfig(edit func(cfg *config, path string) (string, error)) error {
	cfg, path, err := a.loadConfig()
	if err != nil {
		return err
	}
	done, err := edit(cfg, path)
	if err != nil {
		return err
	}
	if err := cfg.save(path); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, done)
	return nil
}

// completeContexts offers the config file's context names.
func (a *app) completeContexts(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	cfg, _, err := a.loadConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var names []string
	for _, c := range cfg.Contexts {
		names = append(names, c.Name)
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
