// Package v1alpha1 holds the etjob.dev/v1alpha1 API: ElasticJob, an elastic
// distributed training job that survives spot reclamation.
//
// +kubebuilder:object:generate=true
// +groupName=etjob.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "etjob.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a scheme. It uses
	// apimachinery only, so that the pure decision core, which imports these
	// types, stays free of controller-runtime.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ElasticJob{}, &ElasticJobList{}, &ScaleOut{}, &ScaleOutList{}, &ScaleIn{}, &ScaleInList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
