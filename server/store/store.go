// Package store keeps the server's accepted state in an embedded bbolt
// database. Every write is one fsynced transaction that also bumps a
// revision counter, so an accepted change survives a crash and versions only
// ever grow, across restarts too.
package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	metaBucket  = []byte("meta")
	revisionKey = []byte("revision")
)

// Store is the persistent state of one server.
type Store struct {
	db *bolt.DB
}

// Op writes one resource: Value nil deletes it.
type Op struct {
	Kind  string
	Key   string
	Value []byte
}

// Open opens (or creates) the database in dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	path := filepath.Join(dir, "weir.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Commit applies ops in one transaction and returns the new revision.
func (s *Store) Commit(ops ...Op) (uint64, error) {
	var rev uint64
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		rev = revision(meta) + 1
		if err := meta.Put(revisionKey, binary.BigEndian.AppendUint64(nil, rev)); err != nil {
			return err
		}
		for _, op := range ops {
			b, err := tx.CreateBucketIfNotExists([]byte(op.Kind))
			if err != nil {
				return err
			}
			if op.Value == nil {
				err = b.Delete([]byte(op.Key))
			} else {
				err = b.Put([]byte(op.Key), op.Value)
			}
			if err != nil {
				return fmt.Errorf("writing %s %s: %w", op.Kind, op.Key, err)
			}
		}
		return nil
	})
	return rev, err
}

// Load calls fn for every stored resource of kind and returns the current revision.
func (s *Store) Load(kind string, fn func(key string, value []byte) error) (uint64, error) {
	var rev uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(metaBucket); meta != nil {
			rev = revision(meta)
		}
		b := tx.Bucket([]byte(kind))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error { return fn(string(k), v) })
	})
	return rev, err
}

func revision(meta *bolt.Bucket) uint64 {
	v := meta.Get(revisionKey)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// ErrCorrupt wraps a stored value that cannot be decoded.
var ErrCorrupt = errors.New("corrupt stored value")
