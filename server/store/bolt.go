package store

// Bolt keeps the state in an embedded bbolt database, for a single server.
// Every write is one fsynced transaction that also bumps a revision counter,
// so an accepted change survives a crash and versions only ever grow, across
// restarts too.
//
// Revisions only grow within one history. A store restored from a copy
// goes back to the copy's revision and then counts up again through
// numbers it had already given to other content; so each run of the server
// that writes starts a new history, recorded with the first revision it
// wrote, and a revision is named together with its history (HistoryAt).
// Agents resume only within the history they hold.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	metaBucket  = []byte("meta")
	revisionKey = []byte("revision")
	historyKey  = []byte("histories")
)

// Bolt is the persistent state of one server.
type Bolt struct {
	db *bolt.DB
	// run names the history this run of the server writes; it is recorded
	// with its first revision by the first Commit.
	run string

	mu        sync.Mutex // guards the fields below
	histories []history  // by first revision
	recorded  bool       // run is in histories
}

// history is one history and the first revision it wrote.
type history struct {
	first uint64
	id    string
}

// createdMarker is written beside the database when it is created: a
// folder that has it but no database lost its state, which must not look
// like a first start.
const createdMarker = "weir.db.created"

// Init lets the next Open start with an empty store where a database was
// lost (missing or 0 bytes): the operator says so. It refuses a database
// that holds anything, which only a restore or its removal replaces.
func Init(dir string) error {
	path := filepath.Join(dir, "weir.db")
	switch fi, err := os.Stat(path); {
	case err == nil && fi.Size() > 0:
		return fmt.Errorf("%s holds a store: --init starts afresh only where it was lost; remove it yourself to throw it away", path)
	case err == nil:
		if err := os.Remove(path); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := os.Remove(filepath.Join(dir, createdMarker)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Open opens (or creates) the database in dir. A database that is empty
// (0 bytes), missing from a folder that had one, or damaged is an error
// that says so: starting empty would silently drop every resource.
func Open(dir string) (s *Bolt, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	path := filepath.Join(dir, "weir.db")
	marker := filepath.Join(dir, createdMarker)
	switch fi, err := os.Stat(path); {
	case err == nil && fi.Size() == 0:
		return nil, fmt.Errorf("%s is empty (0 bytes): refusing to start with no state; restore it from a copy, or start afresh with --init", path)
	case errors.Is(err, fs.ErrNotExist):
		if _, merr := os.Stat(marker); merr == nil {
			return nil, fmt.Errorf("%s is missing but this folder had one (%s exists): refusing to start with no state; restore it from a copy, or start afresh with --init", path, createdMarker)
		}
	case err != nil:
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	// bbolt panics on some damaged pages: say so instead of dying with a
	// stack trace.
	var db *bolt.DB
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				db.Close()
			}
			s, err = nil, fmt.Errorf("%s is damaged (%v): restore it from a copy", path, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		db.Close()
		return nil, fmt.Errorf("marking %s as created: %w", path, err)
	}
	s = &Bolt{db: db, run: NewHistoryID()}
	if err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return fmt.Errorf("damaged: %w", err)
		}
		if meta := tx.Bucket(metaBucket); meta != nil {
			s.histories = decodeHistories(meta.Get(historyKey))
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("reading %s: %w (restore it from a copy)", path, err)
	}
	return s, nil
}

// NewHistoryID makes a random name for a new history.
func NewHistoryID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// HistoryAt names the history revision rev belongs to; "" for revisions
// written before histories were recorded (and for 0).
func (s *Bolt) HistoryAt(rev uint64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := ""
	for _, h := range s.histories {
		if h.first > rev {
			break
		}
		id = h.id
	}
	return id
}

func encodeHistories(hs []history) []byte {
	var out []byte
	for _, h := range hs {
		out = binary.BigEndian.AppendUint64(out, h.first)
		out = append(out, byte(len(h.id)))
		out = append(out, h.id...)
	}
	return out
}

func decodeHistories(b []byte) []history {
	var hs []history
	for len(b) >= 9 {
		first, n := binary.BigEndian.Uint64(b), int(b[8])
		if len(b) < 9+n {
			break
		}
		hs = append(hs, history{first, string(b[9 : 9+n])})
		b = b[9+n:]
	}
	return hs
}

// Close closes the database.
func (s *Bolt) Close() error { return s.db.Close() }

// Commit applies ops in one transaction and returns the new revision. Only
// this process writes a Bolt store, so base is always its revision; a
// base that is not is a StaleError all the same.
func (s *Bolt) Commit(base uint64, ops ...Op) (uint64, error) {
	var rev uint64
	// Commits are serialised by bbolt; mu only guards histories for readers.
	s.mu.Lock()
	recorded := s.recorded
	s.mu.Unlock()
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		if cur := revision(meta); cur != base {
			return &StaleError{Revision: cur}
		}
		rev = base + 1
		if err := meta.Put(revisionKey, binary.BigEndian.AppendUint64(nil, rev)); err != nil {
			return err
		}
		if !recorded {
			// This run's first write starts its history.
			hs := append(decodeHistories(meta.Get(historyKey)), history{rev, s.run})
			if err := meta.Put(historyKey, encodeHistories(hs)); err != nil {
				return err
			}
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
	if err == nil && !recorded {
		s.mu.Lock()
		s.histories = append(s.histories, history{rev, s.run})
		s.recorded = true
		s.mu.Unlock()
	}
	return rev, err
}

// Load calls fn for every stored resource, all read in one transaction,
// and returns the revision they were read at. A Bolt store keeps no
// revision per resource: fn is given 0.
func (s *Bolt) Load(fn func(kind, key string, rev uint64, value []byte) error) (uint64, error) {
	var rev uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(metaBucket); meta != nil {
			rev = revision(meta)
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			if string(name) == string(metaBucket) {
				return nil
			}
			kind := string(name)
			return b.ForEach(func(k, v []byte) error { return fn(kind, string(k), 0, v) })
		})
	})
	return rev, err
}

// Watch waits for ctx: only this process writes a Bolt store, so there
// are no other writes to follow.
func (s *Bolt) Watch(ctx context.Context, after uint64, fn func(rev uint64, ops []Op) error) error {
	<-ctx.Done()
	return ctx.Err()
}

func revision(meta *bolt.Bucket) uint64 {
	v := meta.Get(revisionKey)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}
