// cnpg-check strictly decodes Kubernetes manifests rendered by pglab into the published Go types
// (CloudNativePG's github.com/cloudnative-pg/api, k8s.io/api) and re-checks the admission rules pglab relies on,
// so that manifests are validated without a cluster. Unknown fields, duplicate fields and wrong types fail.
//
// Usage: cnpg-check FILE...   (a file may hold several YAML documents). Exit 0: all valid; 1: a manifest
// failed (one line per problem, "FILE[#doc] Kind/name: path: message"); 2: usage or unreadable file.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	apiv1 "github.com/cloudnative-pg/api/pkg/api/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// newObject returns an empty object of the Go type registered for apiVersion/kind, or nil.
func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "postgresql.cnpg.io/v1/Cluster":
		return &apiv1.Cluster{}
	case "batch/v1/Job":
		return &batchv1.Job{}
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}
	case "v1/PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}
	}
	return nil
}

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

// checkDocument decodes one YAML document strictly and returns its label and problems.
func checkDocument(doc []byte) (string, []string) {
	data, err := yaml.YAMLToJSONStrict(doc) // also refuses duplicate keys
	if err != nil {
		return "?", []string{"not valid YAML: " + err.Error()}
	}
	var h header
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &h); err != nil {
		return "?", []string{"not a Kubernetes object: " + err.Error()}
	}
	label := h.Kind + "/" + h.Metadata.Name
	obj := newObject(h.APIVersion, h.Kind)
	if obj == nil {
		return label, []string{fmt.Sprintf("apiVersion %q kind %q is not a type cnpg-check knows", h.APIVersion, h.Kind)}
	}
	strictErrs, err := sigsjson.UnmarshalStrict(data, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	var problems []string
	if err != nil {
		problems = append(problems, "wrong type: "+err.Error())
	}
	for _, e := range strictErrs {
		problems = append(problems, e.Error())
	}
	if len(problems) > 0 {
		return label, problems
	}
	if h.Metadata.Name == "" {
		problems = append(problems, "metadata.name: required")
	}
	if c, ok := obj.(*apiv1.Cluster); ok {
		problems = append(problems, checkCluster(c)...)
	}
	return label, problems
}

// checkCluster re-checks the operator's admission rules that matter to pglab, with the webhook's field paths.
func checkCluster(c *apiv1.Cluster) []string {
	var out []string
	s := &c.Spec
	if s.Instances < 1 {
		out = append(out, "spec.instances: must be at least 1")
	}
	if s.ImageName != "" && s.ImageCatalogRef != nil {
		out = append(out, "spec.imageName: imageName and imageCatalogRef are mutually exclusive")
	}
	if s.MaxSyncReplicas > 0 && s.MaxSyncReplicas >= s.Instances {
		out = append(out, "spec.maxSyncReplicas: must be lower than the number of instances")
	}
	if s.MinSyncReplicas > s.MaxSyncReplicas {
		out = append(out, "spec.minSyncReplicas: cannot be greater than maxSyncReplicas")
	}
	if sync := s.PostgresConfiguration.Synchronous; sync != nil {
		if s.MinSyncReplicas != 0 || s.MaxSyncReplicas != 0 {
			out = append(out, "spec.postgresql.synchronous: cannot be mixed with the deprecated "+
				"spec.minSyncReplicas/spec.maxSyncReplicas")
		}
		if sync.Method != apiv1.SynchronousReplicaConfigurationMethodAny &&
			sync.Method != apiv1.SynchronousReplicaConfigurationMethodFirst {
			out = append(out, fmt.Sprintf("spec.postgresql.synchronous.method: %q is not any or first", sync.Method))
		}
		if sync.Number <= 0 {
			out = append(out, "spec.postgresql.synchronous.number: must be greater than zero")
		}
		names := s.Instances + len(sync.StandbyNamesPre) + len(sync.StandbyNamesPost)
		if sync.Number >= names {
			out = append(out, fmt.Sprintf("spec.postgresql.synchronous.number: %d must be lower than the number "+
				"of instances plus the standby names given (%d)", sync.Number, names))
		}
		switch sync.DataDurability {
		case "", apiv1.DataDurabilityLevelRequired:
		case apiv1.DataDurabilityLevelPreferred:
			if len(sync.StandbyNamesPre) > 0 || len(sync.StandbyNamesPost) > 0 {
				out = append(out, "spec.postgresql.synchronous.dataDurability: 'preferred' requires empty "+
					"standbyNamesPre and standbyNamesPost")
			}
		default:
			out = append(out, fmt.Sprintf("spec.postgresql.synchronous.dataDurability: %q is not required or "+
				"preferred", sync.DataDurability))
		}
	}
	out = append(out, checkSize("spec.storage.size", s.StorageConfiguration.Size, true)...)
	if s.WalStorage != nil {
		out = append(out, checkSize("spec.walStorage.size", s.WalStorage.Size, true)...)
	}
	// Guaranteed QoS: a benchmark must not share CPU or memory it believes it owns.
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := s.Resources.Requests[name]
		lim, hasLim := s.Resources.Limits[name]
		path := "spec.resources"
		switch {
		case !hasReq || !hasLim:
			out = append(out, fmt.Sprintf("%s: requests and limits of %s are both needed for Guaranteed QoS", path, name))
		case req.Cmp(lim) != 0:
			out = append(out, fmt.Sprintf("%s: requests.%s (%s) must equal limits.%s (%s) for Guaranteed QoS",
				path, name, req.String(), name, lim.String()))
		}
	}
	if s.Affinity.PodAntiAffinityType != "" && s.Affinity.PodAntiAffinityType != "preferred" &&
		s.Affinity.PodAntiAffinityType != "required" {
		out = append(out, fmt.Sprintf("spec.affinity.podAntiAffinityType: %q is not preferred or required",
			s.Affinity.PodAntiAffinityType))
	}
	return out
}

func checkSize(path, value string, required bool) []string {
	if value == "" {
		if required {
			return []string{path + ": required"}
		}
		return nil
	}
	q, err := resource.ParseQuantity(value)
	if err != nil {
		return []string{fmt.Sprintf("%s: %q is not a quantity such as 10Gi", path, value)}
	}
	if q.Sign() <= 0 {
		return []string{fmt.Sprintf("%s: %q must be positive", path, value)}
	}
	return nil
}

func checkFile(name string) (int, []string, error) {
	f, err := os.Open(name)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var lines []string
	docs := 0
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return docs, nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 || strings.TrimSpace(strings.TrimPrefix(string(doc), "---")) == "" {
			continue
		}
		docs++
		label, problems := checkDocument(doc)
		where := name
		if docs > 1 {
			where = fmt.Sprintf("%s#%d", name, docs)
		}
		for _, p := range problems {
			lines = append(lines, fmt.Sprintf("%s %s: %s", where, label, p))
		}
	}
	return docs, lines, nil
}

func main() {
	if len(os.Args) < 2 || strings.HasPrefix(os.Args[1], "-") {
		fmt.Fprintln(os.Stderr, "usage: cnpg-check FILE...  (strict decode into CloudNativePG "+apiVersion+
			" and Kubernetes types)")
		os.Exit(2)
	}
	failed, total := false, 0
	for _, name := range os.Args[1:] {
		docs, lines, err := checkFile(name)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(2)
		}
		total += docs
		for _, l := range lines {
			fmt.Println(l)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
	fmt.Printf("ok: %d manifests valid against github.com/cloudnative-pg/api %s\n", total, apiVersion)
}
