package rendezvous

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// quickGather joins one round as rank 0 of a world of two and gives up soon: the tests here
// want the refusal, which comes at once, not a round.
func quickGather(store *FileStore) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := store.Gather(ctx, GatherRequest{Round: "join", Rank: 0, Size: 2, Who: `"w0"`, Value: []byte{0}, WaitMs: 300})
	return err
}

func TestFileStoreFormsAWorldWithAToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	formsWorld(t, storeTestContext(t), NewFileStore(path, "s3cret"), "join", 3)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := st.Mode().Perm(); mode != 0o600 {
		t.Fatalf("the store file was made with mode %04o, want 0600", mode)
	}
}

func TestFileStoreRefusesFilesOthersControl(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, path string)
		want string
	}{
		{"writable by others", func(t *testing.T, path string) {
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			os.Chmod(path, 0o666)
		}, "may be written by others"},
		{"a symbolic link", func(t *testing.T, path string) {
			target := path + ".target"
			if err := os.WriteFile(target, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, "is a symbolic link"},
		{"a directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "is a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "store")
			c.make(t, path)
			err := quickGather(NewFileStore(path, ""))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("gather through %s: %v, want an error saying %q", c.name, err, c.want)
			}
		})
	}
}

func TestFileStoreRefusesAFileAnotherUserCreatedFirst(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to make a file another user's (CI runs as root)")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o1777) // a shared directory, as /tmp
	path := filepath.Join(dir, "store")
	// What user nobody (uid 65534) would leave there: an empty file anyone may write.
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o666} {
		os.Chmod(path, mode)
		err := quickGather(NewFileStore(path, ""))
		if err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Fatalf("gather through a %04o file of uid 65534: %v, want it refused naming the owner", mode, err)
		}
	}
}

// forgedRecord appends a record as one who lacks the token would: unsigned, or signed with
// another key.
func forgedRecord(t *testing.T, path string, signWith string) {
	t.Helper()
	body, err := msgpack.Marshal(&fileRecord{Round: "join", Rank: 1, Size: 2, Who: `"attacker 10.0.0.66:4242"`, Value: []byte{1}})
	if err != nil {
		t.Fatal(err)
	}
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	frame = append(frame, body...)
	if signWith != "" {
		frame = append(frame, NewFileStore(path, signWith).mac(body)...)
	} else {
		frame = append(frame, make([]byte, recordMACBytes)...)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(frame); err != nil {
		t.Fatal(err)
	}
}

func TestFileStoreRefusesRecordsNotSignedWithTheToken(t *testing.T) {
	for _, signWith := range []string{"", "another world's token"} {
		path := filepath.Join(t.TempDir(), "store")
		forgedRecord(t, path, signWith)
		err := quickGather(NewFileStore(path, "s3cret"))
		if err == nil || !strings.Contains(err.Error(), "not signed with the world's token") {
			t.Fatalf("a record signed with %q counted: %v", signWith, err)
		}
	}
}
