package localcluster

import (
	"context"
	"fmt"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/etjob/etjob/config"
)

// RESTConfig returns a client config for the cluster's kubeconfig.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
}

// installCRD installs etjob's CRDs with server-side apply (the ElasticJob CRD
// is too large for client-side apply's annotation) and waits until they are served.
func (c *Cluster) installCRD(ctx context.Context) error {
	cfg, err := c.RESTConfig()
	if err != nil {
		return err
	}
	s := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		return err
	}
	if err := rbacv1.AddToScheme(s); err != nil {
		return err
	}
	cl, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return err
	}
	raws, err := config.CRDs()
	if err != nil {
		return err
	}
	for _, raw := range raws {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(raw, crd); err != nil {
			return fmt.Errorf("parsing an embedded CRD: %w", err)
		}
		if err := c.applyCRD(ctx, cl, crd); err != nil {
			return err
		}
	}
	// The ClusterRole the controller binds every horovod launcher to.
	raw, err := config.LauncherClusterRole()
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(raw, role); err != nil {
		return fmt.Errorf("parsing the embedded launcher ClusterRole: %w", err)
	}
	role.TypeMeta.APIVersion, role.TypeMeta.Kind = "rbac.authorization.k8s.io/v1", "ClusterRole"
	if err := cl.Patch(ctx, role, client.Apply, client.FieldOwner("etjob-cluster"), client.ForceOwnership); err != nil { //nolint:staticcheck // SSA of a typed object
		return fmt.Errorf("installing the ClusterRole %s: %w", role.Name, err)
	}
	c.logf("  %-26s installed", "ClusterRole "+role.Name)
	return nil
}

func (c *Cluster) applyCRD(ctx context.Context, cl client.Client, crd *apiextensionsv1.CustomResourceDefinition) error {
	crd.TypeMeta.APIVersion, crd.TypeMeta.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
	if err := cl.Patch(ctx, crd, client.Apply, client.FieldOwner("etjob-cluster"), client.ForceOwnership); err != nil { //nolint:staticcheck // SSA of a typed object
		return fmt.Errorf("installing the CRD %s: %w", crd.Name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := cl.Get(ctx, client.ObjectKeyFromObject(crd), got); err == nil {
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					c.logf("  %-26s installed", "CRD "+crd.Name)
					return nil
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the CRD %s was not established within 30s", crd.Name)
}
