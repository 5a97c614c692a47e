package processnode

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// refreshInterval is how often the node rewrites the hosts file and the
// pods' configMap, secret, downwardAPI and projected volumes from the
// current objects (a kubelet's sync period is a minute; a second makes
// configuration changes reach training jobs within seconds).
const refreshInterval = time.Second

// wakeUp asks the background loop to rewrite the hosts file soon.
func (p *Provider) wakeUp() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// background keeps the hosts file and the projected volumes current until
// Shutdown.
func (p *Provider) background() {
	tick := time.NewTicker(refreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
			p.refreshHosts()
		case <-tick.C:
			p.refreshHosts()
			p.refreshAllVolumes()
		}
	}
}

// refreshHosts renders the hosts file from every pod of the cluster, this
// node's own pods as the provider knows them (their IPs are known here
// before the API server has them) and the cluster's EndpointSlices (the
// headless Services' names), and writes it when it changed.
func (p *Provider) refreshHosts() {
	byUID := map[string]*corev1.Pod{}
	if p.clusterPods != nil {
		all, _ := p.clusterPods.List(labels.Everything())
		for _, pod := range all {
			byUID[string(pod.UID)] = pod
		}
	}
	own := map[string]bool{}
	p.mu.Lock()
	for _, pr := range p.pods {
		if !pr.deleting {
			byUID[string(pr.pod.UID)] = pr.pod.DeepCopy()
			own[string(pr.pod.UID)] = true
		}
	}
	p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(byUID))
	for _, pod := range byUID {
		pods = append(pods, pod)
	}
	var slices []*discoveryv1.EndpointSlice
	if p.clusterSlices != nil {
		slices, _ = p.clusterSlices.List(labels.Everything())
	}
	if _, err := writeInPlace(p.hostsPath, renderHosts(pods, slices, own)); err != nil {
		slog.Warn("writing the hosts file", "err", err)
	}
}

// refreshAllVolumes rewrites the projected volumes of every started pod.
func (p *Provider) refreshAllVolumes() {
	type item struct {
		pr  *podRun
		pod *corev1.Pod
	}
	var items []item
	p.mu.Lock()
	for _, pr := range p.pods {
		if pr.started && !pr.deleting {
			items = append(items, item{pr, pr.pod})
		}
	}
	p.mu.Unlock()
	for _, it := range items {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.refreshVolumes(ctx, it.pr, it.pod); err != nil {
			slog.Debug("refreshing volumes", "pod", it.pod.Namespace+"/"+it.pod.Name, "err", err)
		}
		cancel()
	}
}
