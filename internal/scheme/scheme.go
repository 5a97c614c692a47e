// Package scheme is the one runtime.Scheme constructor of etjob's clients:
// the CLI's, the controller's, the local cluster's and the tests'.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// New returns a scheme with the built-in types and etjob's API.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err) // static registrations: a failure is a programming error
	}
	if err := etjobv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}
