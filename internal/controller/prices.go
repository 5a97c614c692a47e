package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// PriceTableRefresh is how often the controller reads the admin's price
// table again: a change applies to each job at its first pass after that.
const PriceTableRefresh = 30 * time.Second

// PriceTables reads the platform admin's price table (etjobv1.PriceTable,
// issue #26 N7) from one ConfigMap (--price-table), past the cache, which
// holds only etjob's own ConfigMaps: at most once every PriceTableRefresh,
// whatever the number of jobs. No ConfigMap: no table, every node's own
// price is trusted, as before there was one; unless Required, when an
// absent table is an empty one (no node has a price: the nodes' own are not
// trusted) and a table once read stays in force when its ConfigMap goes
// (issue #42, M5). A table that does not parse leaves the last good one in
// force (none: the nodes' own prices, or no price where Required), and is
// logged once.
type PriceTables struct {
	Reader client.Reader
	Key    types.NamespacedName
	Clock  clock.PassiveClock
	// KeyLabelPrefix is --price-key-label-prefix (PriceTable.KeyLabelPrefix).
	KeyLabelPrefix string
	// Required is --price-table-required: the table fails closed.
	Required bool

	mu    sync.Mutex
	table *etjobv1.PriceTable
	read  time.Time
	said  string
}

// PriceTableFlags are --price-table, --price-key-label-prefix and
// --price-table-required.
type PriceTableFlags struct {
	Key            types.NamespacedName
	KeyLabelPrefix string
	Required       bool
}

// PriceTables is the reader of the table the flags name.
func (f PriceTableFlags) PriceTables(r client.Reader, clk clock.PassiveClock) *PriceTables {
	return &PriceTables{Reader: r, Key: f.Key, KeyLabelPrefix: f.KeyLabelPrefix, Required: f.Required, Clock: clk}
}

// ParsePriceKeyLabelPrefix reads --price-key-label-prefix: "" (the
// kubelets' labels) or a prefix that makes <prefix>instance-type and
// <prefix>capacity-type valid label keys. One outside
// node-restriction.kubernetes.io/ is taken, and said: a kubelet may set it.
func ParsePriceKeyLabelPrefix(s string) (warning string, err error) {
	if s == "" {
		return "", nil
	}
	for _, k := range []string{s + etjobv1.PriceKeyInstanceType, s + etjobv1.PriceKeyCapacityType} {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return "", fmt.Errorf("%q: %s is no label key: %s", s, k, strings.Join(errs, "; "))
		}
	}
	if !strings.HasPrefix(s, NodeRestrictionPrefix+"/") {
		warning = fmt.Sprintf("%s is not under %s/: a kubelet may set those labels on its own Node, so a rooted node can still choose its price-table row", s, NodeRestrictionPrefix)
	}
	return warning, nil
}

// ParsePriceTableFlag reads --price-table: NAMESPACE/NAME, or "" for none.
func ParsePriceTableFlag(v string) (types.NamespacedName, error) {
	if v == "" {
		return types.NamespacedName{}, nil
	}
	ns, name, ok := strings.Cut(v, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("%q: want NAMESPACE/NAME of a ConfigMap", v)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// Get is the table in force (nil: none), read again when it is older than
// PriceTableRefresh. A nil PriceTables has none.
func (p *PriceTables) Get(ctx context.Context) *etjobv1.PriceTable {
	if p == nil || p.Key.Name == "" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.Clock.Now()
	if !p.read.IsZero() && now.Sub(p.read) < PriceTableRefresh {
		return p.table
	}
	p.read = now
	cm := &corev1.ConfigMap{}
	err := p.Reader.Get(ctx, p.Key, cm)
	switch {
	case apierrors.IsNotFound(err) && p.Required && p.table != nil && len(p.table.Prices) > 0:
		p.say(ctx, nil, "the price table is gone; the last one read stays in force (--price-table-required)")
	case apierrors.IsNotFound(err) && p.Required:
		p.table = &etjobv1.PriceTable{KeyLabelPrefix: p.KeyLabelPrefix}
		p.say(ctx, nil, "no price table: no node has a price, its own is not trusted (--price-table-required); price limits, budgets and the bill wait for the table")
	case apierrors.IsNotFound(err):
		p.table = nil
		p.say(ctx, nil, "no price table: every node's own price is trusted (create it, or set --price-table-required, to stop that)")
	case err != nil && p.Required && p.table == nil:
		p.table = &etjobv1.PriceTable{KeyLabelPrefix: p.KeyLabelPrefix}
		p.say(ctx, err, "reading the price table; until it is read no node has a price (--price-table-required)")
	case err != nil:
		p.say(ctx, err, "reading the price table; the last one stays in force")
	default:
		t, err := etjobv1.ParsePriceTable(cm.Data[etjobv1.PriceTableKey])
		if err != nil {
			if p.Required && p.table == nil {
				p.table = &etjobv1.PriceTable{KeyLabelPrefix: p.KeyLabelPrefix}
			}
			p.say(ctx, fmt.Errorf("key %q: %w", etjobv1.PriceTableKey, err), "the price table does not parse; the last good one stays in force")
			break
		}
		t.KeyLabelPrefix = p.KeyLabelPrefix
		p.table = t
		by := "the kubelets' instance-type and capacity labels"
		if t.KeyLabelPrefix != "" {
			by = "the labels " + t.KeyLabelPrefix + etjobv1.PriceKeyInstanceType + " and " + t.KeyLabelPrefix + etjobv1.PriceKeyCapacityType
		}
		p.say(ctx, nil, fmt.Sprintf("price table in force: %d rows, a node's row by %s; nodes' own prices may only raise them", len(t.Prices), by))
	}
	return p.table
}

// say logs msg when it differs from the last: once a change, not a pass.
func (p *PriceTables) say(ctx context.Context, err error, msg string) {
	line := msg
	if err != nil {
		line += ": " + err.Error()
	}
	if line == p.said {
		return
	}
	p.said = line
	log := ctrl.LoggerFrom(ctx).WithValues("configMap", p.Key.String())
	if err != nil {
		log.Error(err, msg)
	} else {
		log.Info(msg)
	}
}
