package processnode

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// fileProjection is one file of a configMap, secret, downwardAPI or projected
// volume.
type fileProjection struct {
	data []byte
	mode os.FileMode
}

const (
	dataDirName    = "..data"
	newDataDirName = "..data_tmp"
)

// writeAtomic makes dir show payload the way a kubelet's AtomicWriter does
// (pkg/volume/util/atomic_writer.go): the files live in a timestamped
// directory "..<time>", "..data" is a symlink to it that is swapped with a
// rename, and every top-level name of the payload is a symlink "name ->
// ..data/name". A reader therefore sees the old or the new set of files,
// never a mix, and a directory bind mount of dir sees every update. It does
// nothing when dir already shows payload, and reports whether it wrote.
func writeAtomic(dir string, payload map[string]fileProjection) (bool, error) {
	for p := range payload {
		if err := validateProjectionPath(p); err != nil {
			return false, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	oldTS, _ := os.Readlink(filepath.Join(dir, dataDirName))
	if oldTS != "" && sameContent(filepath.Join(dir, oldTS), payload) {
		return false, nil
	}
	tsDir, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return false, err
	}
	for p, f := range payload {
		full := filepath.Join(tsDir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return false, err
		}
		if err := os.WriteFile(full, f.data, f.mode); err != nil {
			return false, err
		}
		if err := os.Chmod(full, f.mode); err != nil { // WriteFile's mode is masked by the umask
			return false, err
		}
	}
	if err := os.Chmod(tsDir, 0o755); err != nil {
		return false, err
	}
	tmpLink := filepath.Join(dir, newDataDirName)
	_ = os.Remove(tmpLink)
	if err := os.Symlink(filepath.Base(tsDir), tmpLink); err != nil {
		return false, err
	}
	if err := os.Rename(tmpLink, filepath.Join(dir, dataDirName)); err != nil {
		return false, err
	}
	want := map[string]bool{}
	for p := range payload {
		top, _, _ := strings.Cut(p, "/")
		want[top] = true
	}
	for top := range want {
		link := filepath.Join(dir, top)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join(dataDirName, top) {
			continue
		}
		_ = os.RemoveAll(link)
		if err := os.Symlink(filepath.Join(dataDirName, top), link); err != nil {
			return false, err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == dataDirName || name == filepath.Base(tsDir):
		case strings.HasPrefix(name, ".."):
			_ = os.RemoveAll(filepath.Join(dir, name)) // an older timestamped directory
		case !want[name] && e.Type()&fs.ModeSymlink != 0:
			_ = os.Remove(filepath.Join(dir, name)) // a key that is gone
		}
	}
	return true, nil
}

// validateProjectionPath refuses paths that would leave the volume, as the
// API server's validation of items[].path does.
func validateProjectionPath(p string) error {
	if p == "" || filepath.IsAbs(p) || strings.HasPrefix(p, "..") {
		return fmt.Errorf("volume file path %q must be relative and must not start with '..'", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return fmt.Errorf("volume file path %q must not contain '..'", p)
		}
	}
	return nil
}

// sameContent reports whether tsDir holds exactly payload, modes included.
func sameContent(tsDir string, payload map[string]fileProjection) bool {
	found := map[string]bool{}
	same := true
	err := filepath.WalkDir(tsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !same {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(tsDir, path)
		f, ok := payload[rel]
		info, ierr := d.Info()
		if !ok || ierr != nil || info.Mode().Perm() != f.mode.Perm() {
			same = false
			return nil
		}
		b, rerr := os.ReadFile(path)
		if rerr != nil || !bytes.Equal(b, f.data) {
			same = false
			return nil
		}
		found[rel] = true
		return nil
	})
	return err == nil && same && len(found) == len(payload)
}
