package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/weirlb/weir/internal/tlsconfig"
	"github.com/weirlb/weir/server/store"
	"github.com/weirlb/weir/server/store/etcdstore"
)

// etcdFlags are the flags that say how to reach etcd, shared by the
// server and "store migrate".
type etcdFlags struct{ endpoints, prefix, ca, cert, key *string }

func addEtcdFlags(fs *flag.FlagSet) etcdFlags {
	return etcdFlags{
		endpoints: fs.String("etcd-endpoints", "", "comma-separated etcd client URLs: keep the state in etcd, shared by several replicas of the server, instead of --data-dir (see docs/ha.md)"),
		prefix:    fs.String("etcd-prefix", "/weir", "prefix of Weir's keys in etcd"),
		ca:        fs.String("etcd-ca-file", "", "CA of etcd's serving certificates (PEM); with it, etcd is reached over TLS"),
		cert:      fs.String("etcd-cert-file", "", "client certificate for etcd (PEM)"),
		key:       fs.String("etcd-key-file", "", "client key for etcd (PEM)"),
	}
}

// config is the etcd configuration the flags give, nil without endpoints.
// With TLS, its Source reloads the client certificate (the CA is read
// once: etcd's client takes a fixed configuration).
func (f etcdFlags) config(log *slog.Logger) (*etcdstore.Config, *tlsconfig.Source, error) {
	if *f.endpoints == "" {
		return nil, nil, nil
	}
	cfg := &etcdstore.Config{Endpoints: strings.Split(*f.endpoints, ","), Prefix: *f.prefix}
	if *f.ca == "" && *f.cert == "" {
		return cfg, nil, nil
	}
	src, err := tlsconfig.Load(tlsconfig.Files{CA: *f.ca, Cert: *f.cert, Key: *f.key}, tlsconfig.Options{Use: "etcd", Log: log})
	if err != nil {
		return nil, nil, fmt.Errorf("--etcd-ca-file, --etcd-cert-file, --etcd-key-file: %w", err)
	}
	cfg.TLS = src.ClientConfig()
	return cfg, src, nil
}

// storeCommand works on stores: "migrate" copies the embedded store into
// etcd, for a single server that becomes replicas.
func storeCommand(args []string) error {
	usage := "usage: weir-server store migrate --data-dir DIR --etcd-endpoints URL,... [--etcd-prefix /weir] [--etcd-ca-file ... --etcd-cert-file ... --etcd-key-file ...]"
	if len(args) == 0 || args[0] != "migrate" {
		return errors.New(usage)
	}
	fs := flag.NewFlagSet("store migrate", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "/var/lib/weir", "folder of the embedded store to copy (the server must be stopped)")
	ef := addEtcdFlags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg, _, err := ef.config(nil)
	if err != nil {
		return err
	}
	if cfg == nil {
		return errors.New("--etcd-endpoints is required\n" + usage)
	}
	from, err := store.Open(*dataDir)
	if err != nil {
		return fmt.Errorf("--data-dir (is the server still running?): %w", err)
	}
	defer from.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	to, err := etcdstore.Open(ctx, *cfg)
	if err != nil {
		return err
	}
	defer to.Close()
	n, err := etcdstore.Migrate(from, to)
	if err != nil {
		return err
	}
	fmt.Printf("copied %d resources from %s to etcd %s under %s\n", n, *dataDir, *ef.endpoints, cfg.Prefix)
	return nil
}
