package processnode

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestWriteAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	first := map[string]fileProjection{
		"a":     {data: []byte("1"), mode: 0o644},
		"sub/b": {data: []byte("2"), mode: 0o600},
	}
	if changed, err := writeAtomic(dir, first); err != nil || !changed {
		t.Fatalf("first write: changed=%v err=%v", changed, err)
	}
	assertVolume(t, dir, map[string]string{"a": "1", "sub/b": "2"})
	if fi, _ := os.Stat(filepath.Join(dir, "sub/b")); fi.Mode().Perm() != 0o600 {
		t.Errorf("sub/b mode = %v, want 0600", fi.Mode().Perm())
	}
	if link, _ := os.Readlink(filepath.Join(dir, "a")); link != "..data/a" {
		t.Errorf("a -> %q, want ..data/a", link)
	}
	oldTS, _ := os.Readlink(filepath.Join(dir, dataDirName))

	if changed, err := writeAtomic(dir, first); err != nil || changed {
		t.Errorf("same payload again: changed=%v err=%v, want no change", changed, err)
	}

	second := map[string]fileProjection{"a": {data: []byte("3"), mode: 0o644}, "c": {data: []byte("4"), mode: 0o644}}
	if changed, err := writeAtomic(dir, second); err != nil || !changed {
		t.Fatalf("second write: changed=%v err=%v", changed, err)
	}
	assertVolume(t, dir, map[string]string{"a": "3", "c": "4"})
	if _, err := os.Lstat(filepath.Join(dir, "sub")); !os.IsNotExist(err) {
		t.Errorf("sub still exists after its key went: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, oldTS)); !os.IsNotExist(err) {
		t.Errorf("old data directory %s still exists", oldTS)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") || e.Name() == dataDirName {
			names = append(names, e.Name())
		}
	}
	if want := []string{dataDirName, "a", "c"}; !slices.Equal(names, want) {
		t.Errorf("entries = %v, want %v plus one timestamped directory", names, want)
	}

	if _, err := writeAtomic(dir, map[string]fileProjection{"../escape": {}}); err == nil {
		t.Error("a path with .. was accepted")
	}
}

func assertVolume(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	for p, v := range want {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(b) != v {
			t.Errorf("%s = %q, %v; want %q", p, b, err, v)
		}
	}
}

func TestTailOffset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, []byte("1\n2\n3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for n, want := range map[int]int64{1: 4, 2: 2, 3: 0, 10: 0} {
		if got, err := tailOffset(f, n); err != nil || got != want {
			t.Errorf("tailOffset(%d) = %d, %v; want %d", n, got, err, want)
		}
	}
}
