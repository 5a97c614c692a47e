package trace

import (
	"os"
	"path/filepath"
)

// readShared reads a file of the repository's traces/ (the EC2 p3 and g4dn
// spot traces).
func readShared(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("../../traces", name))
	return string(b), err
}
