package rendezvous

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// FileStore is a Store in a file that every worker of the world can open, for
// init_method="file:///path": workers append records under an exclusive lock and read the
// file until their round is complete. The last worker to close it removes the file, so the
// path can be used again.
//
// The file often sits in a directory other users can write (/tmp): it is opened without
// following a symbolic link and used only if this user owns it and no one else may write it,
// so a file another user created first is refused, not trusted. With the world's token, every
// record carries an HMAC of itself under the token, and a record without a valid one is
// refused too.
type FileStore struct {
	path  string
	token []byte
	poll  time.Duration
}

type fileRecord struct {
	_msgpack struct{} `msgpack:",as_array"`
	Round    string
	Rank     int
	Size     int
	Who      string
	Value    []byte
}

// A record's frame: its length (u32), its msgpack body, and with a token the HMAC-SHA256 of
// the body under it.
const recordMACBytes = sha256.Size

// leaveRound is the round every worker joins when it closes the store.
const leaveRound = "\x00leave"

// NewFileStore returns a store kept in the file at path; token, if not empty, authenticates
// its records.
func NewFileStore(path, token string) *FileStore {
	return &FileStore{path: path, token: []byte(token), poll: 5 * time.Millisecond}
}

// open opens the store file without following a symbolic link, creating it (mode 0600) if
// create, and checks that it is this user's and writable by no one else.
func (s *FileStore) open(flags int, create bool) (*os.File, error) {
	flags |= syscall.O_NOFOLLOW | syscall.O_CLOEXEC
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(s.path, flags, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("store file %s is a symbolic link: refusing it (another user may have planted it)", s.path)
		}
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat the store file %s: %w", s.path, err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		err = fmt.Errorf("store file %s is not a regular file: refusing it", s.path)
	case int(st.Uid) != os.Getuid():
		err = fmt.Errorf("store file %s belongs to uid %d, not to this user (uid %d): refusing it (another user may have created it first; remove it or use a path only this user can write)", s.path, st.Uid, os.Getuid())
	case st.Mode&0o022 != 0:
		err = fmt.Errorf("store file %s may be written by others (mode %04o): refusing it (remove it, or make it 0600)", s.path, st.Mode&0o7777)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// mac is the HMAC of a record's body under the token.
func (s *FileStore) mac(body []byte) []byte {
	h := hmac.New(sha256.New, s.token)
	h.Write(body)
	return h.Sum(nil)
}

// Gather implements Store.
func (s *FileStore) Gather(ctx context.Context, req GatherRequest) ([][]byte, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	if err := s.append(fileRecord{Round: req.Round, Rank: req.Rank, Size: req.Size, Who: req.Who, Value: req.Value}); err != nil {
		return nil, err
	}
	var deadline <-chan time.Time
	if d := req.wait(); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		deadline = t.C
	}
	poll := s.poll
	for {
		values, who, err := s.round(req)
		if err != nil || values != nil {
			return values, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("round %q: %w", req.Round, ctx.Err())
		case <-deadline:
			return nil, fmt.Errorf("round %q timed out after %v: ranks %s of world size %d never joined (store file %s)", req.Round, req.wait(), missingRanks(req.Size, who), req.Size, s.path)
		case <-time.After(poll):
			poll = min(2*poll, 100*time.Millisecond)
		}
	}
}

// round reads the file and returns the round's values once complete, or who joined so far.
func (s *FileStore) round(req GatherRequest) ([][]byte, []string, error) {
	records, err := s.read()
	if err != nil {
		return nil, nil, err
	}
	who := make([]string, req.Size)
	values := make([][]byte, req.Size)
	joined := 0
	for _, r := range records {
		if r.Round != req.Round {
			continue
		}
		switch {
		case r.Size != req.Size:
			return nil, nil, fmt.Errorf("round %q: %s joined with world size %d but others use %d", req.Round, r.Who, r.Size, req.Size)
		case r.Rank < 0 || r.Rank >= req.Size:
			return nil, nil, fmt.Errorf("round %q: rank %d (%s) is out of range for world size %d", req.Round, r.Rank, r.Who, req.Size)
		case who[r.Rank] != "":
			return nil, nil, fmt.Errorf("round %q: rank %d was taken by both %s and %s (is %s left from an earlier world? remove it)", req.Round, r.Rank, who[r.Rank], r.Who, s.path)
		}
		who[r.Rank], values[r.Rank] = r.Who, r.Value
		joined++
	}
	if joined < req.Size {
		return nil, who, nil
	}
	return values, who, nil
}

func (s *FileStore) append(r fileRecord) error {
	body, err := msgpack.Marshal(&r)
	if err != nil {
		return err
	}
	f, err := s.open(os.O_WRONLY|os.O_APPEND, true)
	if err != nil {
		return fmt.Errorf("open the store file: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock the store file %s: %w", s.path, err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	frame = append(frame, body...)
	if len(s.token) > 0 {
		frame = append(frame, s.mac(body)...)
	}
	if _, err := f.Write(frame); err != nil {
		return fmt.Errorf("write the store file %s: %w", s.path, err)
	}
	return nil
}

// read returns every complete record in the file; a record being written is skipped.
func (s *FileStore) read() ([]fileRecord, error) {
	f, err := s.open(os.O_RDONLY, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the store file: %w", err)
	}
	data, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("read the store file: %w", err)
	}
	var records []fileRecord
	rd := bytes.NewReader(data)
	for {
		var size uint32
		if err := binary.Read(rd, binary.BigEndian, &size); err != nil {
			return records, nil
		}
		if int(size) > rd.Len() {
			return records, nil
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(rd, body); err != nil {
			return records, nil
		}
		if len(s.token) > 0 {
			mac := make([]byte, recordMACBytes)
			if _, err := io.ReadFull(rd, mac); err != nil {
				return records, nil // being written
			}
			if !hmac.Equal(mac, s.mac(body)) {
				return nil, fmt.Errorf("store file %s holds a record not signed with the world's token: refusing it (another world's, or forged)", s.path)
			}
		}
		var r fileRecord
		if err := msgpack.Unmarshal(body, &r); err != nil {
			return nil, fmt.Errorf("store file %s is corrupt: %w", s.path, err)
		}
		records = append(records, r)
	}
}

// Leave records that rank closed the store; the last of size workers removes the file.
func (s *FileStore) Leave(rank, size int) error {
	if err := s.append(fileRecord{Round: leaveRound, Rank: rank, Size: size}); err != nil {
		return err
	}
	records, err := s.read()
	if err != nil {
		return err
	}
	left := map[int]bool{}
	for _, r := range records {
		if r.Round == leaveRound {
			left[r.Rank] = true
		}
	}
	if len(left) >= size {
		return os.Remove(s.path)
	}
	return nil
}

// Close implements Store; see leave for how the file is cleaned up.
func (s *FileStore) Close() error { return nil }
