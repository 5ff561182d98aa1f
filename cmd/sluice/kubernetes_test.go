package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // the router's type, for protojson
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/internal/rules"
)

// k8sDoc is one document of a file of deploy/kubernetes: what every kind
// has, its spec left as a node for the kind's own type.
type k8sDoc struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data      map[string]string `yaml:"data"`      // ConfigMap
	Resources []string          `yaml:"resources"` // Kustomization
	Spec      yaml.Node         `yaml:"spec"`
	file      string
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type deploymentSpec struct {
	Replicas int           `yaml:"replicas"`
	Selector labelSelector `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"metadata"`
		Spec struct {
			TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
			SecurityContext               struct {
				RunAsNonRoot bool `yaml:"runAsNonRoot"`
				RunAsUser    int  `yaml:"runAsUser"`
			} `yaml:"securityContext"`
			Containers []k8sContainer `yaml:"containers"`
			Volumes    []struct {
				Name      string `yaml:"name"`
				ConfigMap struct {
					Name string `yaml:"name"`
				} `yaml:"configMap"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type k8sContainer struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name      string     `yaml:"name"`
		Value     *string    `yaml:"value"`
		ValueFrom *yaml.Node `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"` // a number or a port's name
	} `yaml:"httpGet"`
}

type serviceSpec struct {
	ClusterIP string            `yaml:"clusterIP"`
	Selector  map[string]string `yaml:"selector"`
	Ports     []struct {
		Name       string    `yaml:"name"`
		Port       int       `yaml:"port"`
		TargetPort yaml.Node `yaml:"targetPort"`
	} `yaml:"ports"`
}

type pdbSpec struct {
	MinAvailable int           `yaml:"minAvailable"`
	Selector     labelSelector `yaml:"selector"`
}

type podMonitorSpec struct {
	Selector            labelSelector `yaml:"selector"`
	PodMetricsEndpoints []struct {
		Port string `yaml:"port"`
		Path string `yaml:"path"`
	} `yaml:"podMetricsEndpoints"`
}

// k8sDir is deploy/kubernetes, from cmd/sluice.
var k8sDir = filepath.Join("..", "..", "deploy", "kubernetes")

// readManifests decodes every document of every YAML file of dir.
func readManifests(t *testing.T, dir string) []*k8sDoc {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	var docs []*k8sDoc
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			d := &k8sDoc{file: filepath.Base(f)}
			if err := dec.Decode(d); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if d.APIVersion == "" || d.Kind == "" || (d.Kind != "Kustomization" && d.Metadata.Name == "") {
				t.Errorf("%s: a document without apiVersion, kind or name", d.file)
			}
			docs = append(docs, d)
		}
	}
	return docs
}

// decodeSpec decodes d's spec into v.
func decodeSpec(t *testing.T, d *k8sDoc, v any) {
	t.Helper()
	if err := d.Spec.Decode(v); err != nil {
		t.Fatalf("%s: %s %s: %v", d.file, d.Kind, d.Metadata.Name, err)
	}
}

// one returns the only document of kind (and name, unless ""), failing
// the test unless there is exactly one.
func one(t *testing.T, docs []*k8sDoc, kind, name string) *k8sDoc {
	t.Helper()
	var found []*k8sDoc
	for _, d := range docs {
		if d.Kind == kind && (name == "" || d.Metadata.Name == name) {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d documents of kind %s named %q in %s, want 1", len(found), kind, name, k8sDir)
	}
	return found[0]
}

// serveFlags returns serve's flags by name, as serve -h lists them.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	_, help, err := runArgs(t, t.Context(), "serve", "-h")
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("serve -h: %v", err)
	}
	names := map[string]bool{}
	for name := range flagEntries(t, help) {
		names[name] = true
	}
	return names
}

// selects reports whether selector picks the pods labelled labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// addrPort is the port of a listen address such as ":8081".
func addrPort(t *testing.T, what, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n <= 0 {
		t.Fatalf("%s %q: want a fixed port", what, addr)
	}
	return n
}

// mebibytes parses a Kubernetes quantity in Mi or Gi.
func mebibytes(t *testing.T, q string) int {
	t.Helper()
	for suffix, mult := range map[string]int{"Mi": 1, "Gi": 1024} {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			if v, err := strconv.Atoi(n); err == nil {
				return v * mult
			}
		}
	}
	t.Fatalf("memory quantity %q: want NMi or NGi", q)
	return 0
}

// TestKubernetesManifests parses every manifest of deploy/kubernetes and
// checks that they agree with each other and with serve: the container's
// arguments and variables are serve's flags, its ports are the ports of
// the addresses it listens on, the Service, the probes and the Prometheus
// scrape reach those ports at paths serve answers, the rules load, and
// the Envoy bootstrap asks the Service's gRPC port about a domain of the
// rules. Then it runs the binary with the Deployment's configuration
// (listening on loopback, counting in memory) and asks it every path the
// manifests name.
func TestKubernetesManifests(t *testing.T) {
	docs := readManifests(t, k8sDir)
	flags := serveFlags(t)
	secrets := map[string]bool{adminTokenEnv: true, redisPasswordEnv: true, sentinelPasswordEnv: true}

	// kustomization.yaml lists every file but those that need a CRD.
	kust := one(t, docs, "Kustomization", "")
	for _, d := range docs {
		listed := slices.Contains(kust.Resources, d.file)
		crd := strings.HasPrefix(d.APIVersion, "monitoring.coreos.com/")
		if d.Kind != "Kustomization" && listed == crd {
			t.Errorf("%s (%s %s): listed in kustomization.yaml: %v; needs a CRD: %v", d.file, d.Kind, d.Metadata.Name, listed, crd)
		}
	}
	for _, r := range kust.Resources {
		if _, err := os.Stat(filepath.Join(k8sDir, r)); err != nil {
			t.Errorf("kustomization.yaml: %v", err)
		}
	}

	// The Deployment's container: serve, configured by flags and SLUICE_*.
	dep := one(t, docs, "Deployment", "sluice")
	var ds deploymentSpec
	decodeSpec(t, dep, &ds)
	pod := ds.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want serve alone", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("container args %q: want serve first", c.Args)
	}
	config := map[string]string{} // serve's configuration, by flag name
	var literalEnv []string
	for _, e := range c.Env {
		if secrets[e.Name] {
			if e.Value != nil || e.ValueFrom == nil {
				t.Errorf("$%s holds a secret: take it from a Secret (valueFrom), never a literal value", e.Name)
			}
			continue
		}
		name, ok := strings.CutPrefix(e.Name, serveEnvPrefix)
		flagName := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		if !ok || !flags[flagName] || envName(serveEnvPrefix, flagName) != e.Name {
			t.Errorf("container variable %s is neither a serve flag's nor a secret's", e.Name)
			continue
		}
		if e.Value == nil {
			t.Errorf("$%s: want a literal value", e.Name)
			continue
		}
		config[flagName] = *e.Value
		literalEnv = append(literalEnv, e.Name+"="+*e.Value)
	}
	for _, a := range c.Args[1:] {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !flags[name] || !hasValue {
			t.Errorf("container argument %q: want --flag=value of a serve flag", a)
			continue
		}
		config[name] = value
	}

	// Ports: the container's named ports are the listen addresses' ports.
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, l := range []struct{ port, flag string }{{"grpc", "grpc-addr"}, {"http", "http-addr"}} {
		if config[l.flag] == "" {
			t.Errorf("the container does not set --%s ($%s): serve's default listens on loopback only", l.flag, envName(serveEnvPrefix, l.flag))
			continue
		}
		if got := addrPort(t, "--"+l.flag, config[l.flag]); got != ports[l.port] {
			t.Errorf("--%s %s, but the container's port %q is %d", l.flag, config[l.flag], l.port, ports[l.port])
		}
	}
	// resolve is the container port that a manifest's port (a number or a
	// name) stands for.
	resolve := func(what string, n yaml.Node) int {
		if p, err := strconv.Atoi(n.Value); err == nil {
			known := false
			for _, cp := range ports {
				known = known || cp == p
			}
			if !known {
				t.Errorf("%s: port %d is not one of the container's", what, p)
			}
			return p
		}
		p, ok := ports[n.Value]
		if !ok {
			t.Errorf("%s: port %q is not a name of the container's ports %v", what, n.Value, ports)
		}
		return p
	}

	// Probes and the Prometheus scrape: paths of serve's HTTP listener.
	paths := map[string]string{} // path → what asks for it
	for _, p := range []struct {
		what, want string
		probe      *k8sProbe
	}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s with httpGet", p.what)
			continue
		}
		if p.probe.HTTPGet.Path != p.want {
			t.Errorf("%s path %q, want %s", p.what, p.probe.HTTPGet.Path, p.want)
		}
		if resolve(p.what, p.probe.HTTPGet.Port) != ports["http"] {
			t.Errorf("%s: not on serve's HTTP port", p.what)
		}
		paths[p.probe.HTTPGet.Path] = p.what
	}
	ann := ds.Template.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(ports["http"]) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("prometheus.io annotations %v: want scrape true on the HTTP port %d at /metrics", ann, ports["http"])
	}
	paths[ann["prometheus.io/path"]] = "prometheus.io/path"
	for _, d := range docs {
		if d.Kind != "PodMonitor" {
			continue
		}
		var pm podMonitorSpec
		decodeSpec(t, d, &pm)
		if !selects(pm.Selector.MatchLabels, ds.Template.Metadata.Labels) {
			t.Errorf("PodMonitor %s does not select the pods", d.Metadata.Name)
		}
		for _, e := range pm.PodMetricsEndpoints {
			if ports[e.Port] != ports["http"] || e.Path == "" {
				t.Errorf("PodMonitor %s scrapes port %q path %q: want the HTTP port's name", d.Metadata.Name, e.Port, e.Path)
			}
			paths[e.Path] = "PodMonitor"
		}
	}

	// Selectors, replicas, the disruption budget.
	if !selects(ds.Selector.MatchLabels, ds.Template.Metadata.Labels) {
		t.Errorf("the Deployment's selector does not select its own pods")
	}
	var pdb pdbSpec
	decodeSpec(t, one(t, docs, "PodDisruptionBudget", ""), &pdb)
	if !selects(pdb.Selector.MatchLabels, ds.Template.Metadata.Labels) || pdb.MinAvailable < 1 || pdb.MinAvailable >= ds.Replicas {
		t.Errorf("PodDisruptionBudget %+v: want it to select the pods and keep 1 to replicas-1 (%d) of them", pdb, ds.Replicas)
	}
	// The run below counts in memory, so the store is checked here.
	switch config["store"] {
	case "", "memory":
		if ds.Replicas > 1 {
			t.Errorf("%d replicas counting in memory: each would enforce the whole limit", ds.Replicas)
		}
	case "redis":
		if config["redis-addr"] == "" {
			t.Errorf("--store redis without --redis-addr")
		}
	default:
		t.Errorf("--store %q: want memory or redis", config["store"])
	}
	if config["store"] == "redis" && config["replicas"] != strconv.Itoa(ds.Replicas) {
		t.Errorf("--replicas %q, but the Deployment runs %d", config["replicas"], ds.Replicas)
	}

	// Resources, the memory limit, shutdown, security.
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	} else if m := config["memory-limit-mib"]; m != "" {
		soft, _ := strconv.Atoi(m)
		if hard := mebibytes(t, c.Resources.Limits["memory"]); soft <= 0 || soft >= hard {
			t.Errorf("--memory-limit-mib %s: want it below the container's limit, %d MiB", m, hard)
		}
	}
	shutdown := 10 * time.Second // serve's default
	if s := config["shutdown-timeout"]; s != "" {
		var err error
		if shutdown, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= shutdown+time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v: want more than preStop's %ds plus --shutdown-timeout %v", grace, c.Lifecycle.PreStop.Sleep.Seconds, shutdown)
	}
	if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser == 0 || !c.SecurityContext.ReadOnlyRootFilesystem ||
		c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("want a non-root pod, a read-only root filesystem and no privilege escalation")
	}

	// The rules: a ConfigMap volume mounted whole where --rules points.
	var rulesMap *k8sDoc
	for _, m := range c.VolumeMounts {
		if m.MountPath != config["rules"] {
			continue
		}
		if m.SubPath != "" {
			t.Errorf("the rules are mounted with subPath %q: such a mount never sees a change to the ConfigMap", m.SubPath)
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap.Name != "" {
				rulesMap = one(t, docs, "ConfigMap", v.ConfigMap.Name)
			}
		}
	}
	if rulesMap == nil {
		t.Fatalf("no ConfigMap volume mounted at --rules %q", config["rules"])
	}
	rulesDir := t.TempDir()
	topKeys := map[string]map[string]bool{} // domain → its top-level descriptor keys
	for name, content := range rulesMap.Data {
		if err := os.WriteFile(filepath.Join(rulesDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		var f struct {
			Domain      string `yaml:"domain"`
			Descriptors []struct {
				Key string `yaml:"key"`
			} `yaml:"descriptors"`
		}
		if err := yaml.Unmarshal([]byte(content), &f); err != nil {
			t.Fatalf("ConfigMap %s, %s: %v", rulesMap.Metadata.Name, name, err)
		}
		topKeys[f.Domain] = map[string]bool{}
		for _, d := range f.Descriptors {
			topKeys[f.Domain][d.Key] = true
		}
	}
	set, err := rules.Load(rulesDir)
	if err != nil {
		t.Fatalf("the rules of ConfigMap %s do not load:\n%v", rulesMap.Metadata.Name, err)
	}

	// The Service: serve's pods, its ports by name.
	svcDoc := one(t, docs, "Service", "")
	var svc serviceSpec
	decodeSpec(t, svcDoc, &svc)
	if !selects(svc.Selector, ds.Template.Metadata.Labels) {
		t.Errorf("Service %s does not select the pods", svcDoc.Metadata.Name)
	}
	svcPorts := map[string]int{}
	for _, p := range svc.Ports {
		if resolve("Service port "+p.Name, p.TargetPort) != ports[p.Name] {
			t.Errorf("Service port %q targets another port than the container's port of that name", p.Name)
		}
		svcPorts[p.Name] = p.Port
	}
	if svcPorts["grpc"] == 0 || svcPorts["http"] == 0 {
		t.Errorf("Service ports %v: want grpc and http", svcPorts)
	}

	checkEnvoy(t, one(t, docs, "ConfigMap", "sluice-envoy"), svcDoc.Metadata.Name, svcPorts["grpc"], set, topKeys)
	checkContainerfile(t, flags, ports)

	// Serve with the Deployment's configuration, on loopback and in
	// memory, and ask for every path the manifests name.
	bin := buildSluice(t)
	p := startSluice(t, bin, literalEnv, append(slices.Clone(c.Args),
		"--rules", rulesDir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--store", "memory", "--log-format", "json")...)
	up := p.next(t, "sluice serving", 30*time.Second)
	if up.str("domains") != strings.Join(set.Domains(), ",") {
		t.Errorf("serving %v, want the domains %v", up, set.Domains())
	}
	for path, what := range paths {
		resp, err := http.Get("http://" + up.str("http") + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s (%s): %s", path, what, resp.Status)
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.waitExit(t, shutdown+5*time.Second); err != nil {
		t.Errorf("serve exited with %v after SIGTERM, want 0", err)
	}
	t.Logf("%d documents; serve answered %d paths with the Deployment's configuration", len(docs), len(paths))
}

// checkEnvoy decodes the Envoy bootstrap of cm as Envoy does (unknown
// fields refused, then Envoy's own validation rules) and checks its rate
// limit filter: a domain of set whose descriptor keys the rules know, and
// a cluster that reaches the Service service's gRPC port over HTTP/2.
func checkEnvoy(t *testing.T, cm *k8sDoc, service string, grpcPort int, set *rules.Set, topKeys map[string]map[string]bool) {
	t.Helper()
	var tree any
	if err := yaml.Unmarshal([]byte(cm.Data["envoy.yaml"]), &tree); err != nil {
		t.Fatalf("ConfigMap %s, envoy.yaml: %v", cm.Metadata.Name, err)
	}
	js, err := json.Marshal(tree)
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		t.Fatalf("envoy.yaml is not an Envoy bootstrap: %v", err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range boot.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	filters := 0
	for _, l := range boot.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, nf := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if nf.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var rl ratelimitv3.RateLimit
					if hf.GetTypedConfig().UnmarshalTo(&rl) != nil {
						continue
					}
					filters++
					domain := rl.GetDomain()
					if _, ok := set.Domain(domain); !ok {
						t.Errorf("Envoy's rate limit filter asks about domain %q, not one of the rules' %v", domain, set.Domains())
					}
					for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
						for _, r := range vh.GetRateLimits() {
							for _, a := range r.GetActions() {
								key := ""
								switch {
								case a.GetRemoteAddress() != nil:
									key = "remote_address"
								case a.GetRequestHeaders() != nil:
									key = a.GetRequestHeaders().GetDescriptorKey()
								default:
									continue
								}
								if !topKeys[domain][key] {
									t.Errorf("Envoy sends descriptor key %q, which no rule of domain %q has", key, domain)
								}
							}
						}
					}
					cl := clusters[rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()]
					if cl == nil {
						t.Errorf("the rate limit service's cluster is not defined")
						continue
					}
					var opts upstreamhttpv3.HttpProtocolOptions
					if a := cl.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; a == nil ||
						a.UnmarshalTo(&opts) != nil || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
						t.Errorf("cluster %s does not speak HTTP/2, which gRPC needs", cl.GetName())
					}
					for _, hc := range cl.GetHealthChecks() {
						if g := hc.GetGrpcHealthCheck(); g != nil && g.GetServiceName() != "" && g.GetServiceName() != rlsName {
							t.Errorf("cluster %s checks the health of %q; serve reports %q", cl.GetName(), g.GetServiceName(), rlsName)
						}
					}
					n := 0
					for _, e := range cl.GetLoadAssignment().GetEndpoints() {
						for _, lb := range e.GetLbEndpoints() {
							sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
							n++
							if (sa.GetAddress() != service && !strings.HasPrefix(sa.GetAddress(), service+".")) || int(sa.GetPortValue()) != grpcPort {
								t.Errorf("cluster %s reaches %s:%d, want the Service %s's gRPC port %d", cl.GetName(), sa.GetAddress(), sa.GetPortValue(), service, grpcPort)
							}
						}
					}
					if n == 0 {
						t.Errorf("cluster %s has no endpoint", cl.GetName())
					}
				}
			}
		}
	}
	if filters != 1 {
		t.Errorf("envoy.yaml has %d rate limit filters, want 1", filters)
	}
}

// checkContainerfile checks the image's ENV: every SLUICE_ variable is a
// serve flag's, and the addresses listen on the ports the Deployment
// names.
func checkContainerfile(t *testing.T, flags map[string]bool, ports map[string]int) {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "deploy", "container", "Containerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	inEnv := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "ENV "); ok {
			inEnv, line = true, rest
		} else if !inEnv {
			continue
		}
		inEnv = strings.HasSuffix(line, `\`)
		for _, kv := range strings.Fields(strings.TrimSuffix(line, `\`)) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for k := range env {
		name, ok := strings.CutPrefix(k, serveEnvPrefix)
		if !ok || !flags[strings.ToLower(strings.ReplaceAll(name, "_", "-"))] {
			t.Errorf("Containerfile: ENV %s is not a serve flag's variable", k)
		}
	}
	if addrPort(t, "Containerfile SLUICE_GRPC_ADDR", env["SLUICE_GRPC_ADDR"]) != ports["grpc"] ||
		addrPort(t, "Containerfile SLUICE_HTTP_ADDR", env["SLUICE_HTTP_ADDR"]) != ports["http"] {
		t.Errorf("Containerfile: the image listens on %s and %s; the Deployment's ports are %v", env["SLUICE_GRPC_ADDR"], env["SLUICE_HTTP_ADDR"], ports)
	}
}
