package localcluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/chart"
	"github.com/etjob/etjob/internal/instancetype"
	"github.com/etjob/etjob/internal/localcluster/processnode"
)

// The images the chart runs, and the namespaces it installs them in, at
// the chart's defaults (TestChartDefaults keeps them so).
const (
	ControllerImage     = "ghcr.io/etjob/etjob-controller"
	AgentImage          = "ghcr.io/etjob/etjob-agent"
	ControllerNamespace = "etjob-system"
	// PriceTable is the ConfigMap of the admin's node prices that the
	// chart's controller reads (controller.priceTable).
	PriceTable     = "etjob-prices"
	AgentNamespace = "etjob-agent"
	// LeaseName is the controller's leader-election Lease.
	LeaseName = etjobv1.LeaderElectionID
)

// RESTConfig returns a client config for the cluster's kubeconfig.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
}

// ChartValues are the values the local cluster installs charts/etjob with.
// Only what differs from a real cloud:
//   - the controller on the system node (SystemNode: tainted
//     CriticalAddonsOnly, never reclaimed), so that no story takes it away
//     with the nodes it reclaims;
//   - its ports on the pod's IP, since process pods share one network
//     namespace and two replicas would both bind :8443;
//   - each agent reading its own node's emulated metadata service, at the
//     node's IP (one per node: $(NODE_IP) is the node's status.hostIP), a
//     little more often than on a cloud;
//   - ControllerArgs.
func (c *Cluster) ChartValues() map[string]any {
	extra := make([]any, 0, len(c.ControllerArgs))
	for _, a := range c.ControllerArgs {
		extra = append(extra, a)
	}
	return map[string]any{
		"controller": map[string]any{
			"listenOnPodIP": true,
			"nodeSelector":  map[string]any{"node.kubernetes.io/instance-type": SystemType},
			"tolerations":   []any{map[string]any{"key": SystemTaintKey, "operator": "Exists"}},
			"extraArgs":     extra,
		},
		"agent": map[string]any{
			"metadataURL":  fmt.Sprintf("http://$(NODE_IP):%d", MetadataPort),
			"pollInterval": "500ms",
			"priceSource":  "local",
		},
	}
}

// componentImages are the image-table entries that make the chart's
// controller and agent images run the binaries this cluster was given
// (their directories first on PATH: the chart runs them by name).
func componentImages(b Binaries) processnode.Images {
	entry := func(image, bin string) processnode.Image {
		return processnode.Image{Image: image + ":*", Env: map[string]string{"PATH": filepath.Dir(bin) + ":" + imagePath}}
	}
	return processnode.Images{entry(ControllerImage, b.Controller), entry(AgentImage, b.Agent)}
}

// installChart renders charts/etjob with ChartValues and applies every
// object with server-side apply (the ElasticJob CRD is too large for
// client-side apply's annotation): CRDs first, waited for until they are
// served, then namespaces, then the rest. The controller and the agents
// then run as pods on the nodes, under the chart's ServiceAccounts and RBAC.
func (c *Cluster) installChart(ctx context.Context) error {
	cfg, err := c.RESTConfig()
	if err != nil {
		return err
	}
	s := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		return err
	}
	cl, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return err
	}
	objs, err := chart.Objects(c.ChartValues())
	if err != nil {
		return fmt.Errorf("rendering charts/etjob: %w", err)
	}
	rank := func(o *unstructured.Unstructured) int {
		switch o.GetKind() {
		case "CustomResourceDefinition":
			return 0
		case "Namespace":
			return 1
		}
		return 2
	}
	sort.SliceStable(objs, func(i, j int) bool { return rank(objs[i]) < rank(objs[j]) })
	for _, o := range objs {
		if err := cl.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("etjob-cluster"), client.ForceOwnership); err != nil {
			return fmt.Errorf("installing %s %s: %w", o.GetKind(), o.GetName(), err)
		}
		if o.GetKind() == "CustomResourceDefinition" {
			if err := waitEstablished(ctx, cl, o.GetName()); err != nil {
				return err
			}
		}
	}
	// The platform admin's price table, from the instance types' table:
	// the controller (--price-table, the chart's default etjob-prices)
	// then trusts a node's own price only to raise its row's, as on a
	// cloud cluster whose admin keeps one.
	prices := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": PriceTable, "namespace": ControllerNamespace},
		"data":     map[string]any{etjobv1.PriceTableKey: instancetype.PriceTable()},
	}}
	if err := cl.Apply(ctx, client.ApplyConfigurationFromUnstructured(prices), client.FieldOwner("etjob-cluster"), client.ForceOwnership); err != nil {
		return fmt.Errorf("installing the price table %s/%s: %w", ControllerNamespace, PriceTable, err)
	}
	c.logf("  %-26s installed (%d objects and the price table %s)", "chart etjob", len(objs), PriceTable)
	return nil
}

func waitEstablished(ctx context.Context, cl client.Client, name string) error {
	err := poll(ctx, 30*time.Second, func() bool {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if cl.Get(ctx, client.ObjectKey{Name: name}, got) != nil {
			return false
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if errors.Is(err, errPollTimeout) {
		return fmt.Errorf("the CRD %s was not established within 30s", name)
	}
	return err
}
