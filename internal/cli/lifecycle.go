package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// LifecycleOptions are the argument of `etjob suspend`, `resume` and
// `delete`.
type LifecycleOptions struct {
	// Verb is suspend, resume or delete.
	Verb string
	// Names are the jobs.
	Names []string

	factory *factory
	clients *Clients
}

func newLifecycleCommand(f *factory, verb string) *cobra.Command {
	o := &LifecycleOptions{Verb: verb, factory: f}
	short := map[string]string{
		"suspend": "Suspend jobs: workers checkpoint and stop, pods are deleted, the job stays (spec.suspend=true)",
		"resume":  "Resume suspended jobs (spec.suspend=false); they restart from the last checkpoint",
		"delete":  "Delete jobs and their pods",
	}[verb]
	cmd := &cobra.Command{
		Use:               verb + " NAME...",
		Short:             short,
		Example:           f.examples("  etjob " + verb + " elastic-training"),
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: f.completeJobNamesMulti,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Names = args
			cs, err := f.Clients()
			if err != nil {
				return err
			}
			o.clients = cs
			return o.Run(cmd.Context())
		},
	}
	if verb == "delete" {
		addTypeFlag(cmd)
	}
	return cmd
}

// Run applies the verb to every named job; it reports the first error after
// trying them all.
func (o *LifecycleOptions) Run(ctx context.Context) error {
	var first error
	for _, name := range o.Names {
		if err := o.one(ctx, name); err != nil {
			fmt.Fprintf(o.factory.streams.ErrOut, "error: %v\n", err)
			if first == nil {
				first = err
			}
		}
	}
	if first != nil && len(o.Names) > 1 {
		return fmt.Errorf("%s failed for some jobs", o.Verb)
	}
	return first
}

func (o *LifecycleOptions) one(ctx context.Context, name string) error {
	c := o.clients.Client
	job := &etjobv1.ElasticJob{ObjectMeta: metav1.ObjectMeta{Namespace: o.clients.Namespace, Name: name}}
	var err error
	switch o.Verb {
	case "delete":
		err = c.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
	case "suspend", "resume":
		patch := []byte(fmt.Sprintf(`{"spec":{"suspend":%t}}`, o.Verb == "suspend"))
		err = c.Patch(ctx, job, client.RawPatch(types.MergePatchType, patch))
	}
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s not found in namespace %s", jobRef(name), o.clients.Namespace)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", o.Verb, jobRef(name), err)
	}
	past := map[string]string{"delete": "deleted", "suspend": "suspended", "resume": "resumed"}[o.Verb]
	fmt.Fprintf(o.factory.out(), "%s %s\n", jobRef(name), past)
	if o.Verb == "delete" {
		o.factory.log().Info(fmt.Sprintf("The training job %s has been deleted successfully", name))
	}
	return nil
}
