// Package hack embeds the scripts that binaries run themselves: `etjob cluster
// up` builds the control plane with the same script as `make test`.
package hack

import _ "embed"

// BuildControlPlane is hack/build-controlplane.sh.
//
//go:embed build-controlplane.sh
var BuildControlPlane []byte
