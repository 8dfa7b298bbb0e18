// Package helm_test lints and renders Tally's Helm chart and checks what it
// renders: API and workers apart, secrets only by reference and only where
// used, the ingress routing what the README links, metrics behind the token.
package helm_test

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/tally-billing/tally/internal/tools/testtool"
)

// object is the part of a rendered manifest the checks read.
type object struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Selector any `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []struct {
					Name  string `yaml:"name"`
					Ports []struct {
						Name string `yaml:"name"`
					} `yaml:"ports"`
					Env []struct {
						Name      string         `yaml:"name"`
						Value     *string        `yaml:"value"`
						ValueFrom map[string]any `yaml:"valueFrom"`
					} `yaml:"env"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
		Rules []struct {
			HTTP struct {
				Paths []ingressPath `yaml:"paths"`
			} `yaml:"http"`
		} `yaml:"rules"`
		Endpoints []struct {
			Port          string `yaml:"port"`
			Authorization struct {
				Type        string    `yaml:"type"`
				Credentials secretRef `yaml:"credentials"`
			} `yaml:"authorization"`
		} `yaml:"endpoints"`
	} `yaml:"spec"`
}

// secretRef is a key of a Secret.
type secretRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

// ingressPath is one path of an Ingress rule.
type ingressPath struct {
	Path     string `yaml:"path"`
	PathType string `yaml:"pathType"`
	Backend  struct {
		Service struct {
			Name string `yaml:"name"`
		} `yaml:"service"`
	} `yaml:"backend"`
}

// matches reports whether a request for path takes p, as Kubernetes
// matches Exact and Prefix paths (a prefix matches whole path elements).
func (p ingressPath) matches(path string) bool {
	switch p.PathType {
	case "Exact":
		return path == p.Path
	case "Prefix":
		prefix := strings.TrimSuffix(p.Path, "/")
		return path == prefix || strings.HasPrefix(path, prefix+"/")
	}
	return false
}

// routes returns the API Service an Ingress sends path to, or "".
func (o object) routes(path string) string {
	for _, rule := range o.Spec.Rules {
		for _, p := range rule.HTTP.Paths {
			if p.matches(path) {
				return p.Backend.Service.Name
			}
		}
	}
	return ""
}

// envVar is the part of a container's env entry the checks read.
type envVar struct {
	Value     *string
	SecretRef *secretRef
}

// env returns the environment of o's containers by name.
func env(t *testing.T, o object) map[string]envVar {
	t.Helper()
	m := map[string]envVar{}
	for _, c := range o.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			switch {
			case e.ValueFrom != nil:
				require.Nil(t, e.Value, "%s has a value and a reference", e.Name)
				ref, ok := e.ValueFrom["secretKeyRef"].(map[string]any)
				require.True(t, ok, "%s: only secretKeyRef", e.Name)
				m[e.Name] = envVar{SecretRef: &secretRef{Name: ref["name"].(string), Key: ref["key"].(string)}}
			case e.Value != nil:
				m[e.Name] = envVar{Value: e.Value}
			}
		}
	}
	return m
}

func render(t *testing.T, helm string, args ...string) ([]object, string) {
	t.Helper()
	out, err := exec.Command(helm, append([]string{"template", "rel", "tally"}, args...)...).CombinedOutput()
	require.NoError(t, err, "helm template:\n%s", out)
	var objects []object
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if o.Kind != "" {
			objects = append(objects, o)
		}
	}
	return objects, string(out)
}

func TestChart(t *testing.T) {
	helm := testtool.Bin(t, "HELM_BIN", "helm")

	t.Run("Lint", func(t *testing.T) {
		out, err := exec.Command(helm, "lint", "tally").CombinedOutput()
		require.NoError(t, err, "helm lint:\n%s", out)
	})

	t.Run("Renders", func(t *testing.T) {
		objects, text := render(t, helm, "--set", "ingress.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
			"--set", "secrets.metricsToken.name=tally-metrics", "--set", "env.TALLY_PERIOD=day")
		kinds := map[string]int{}
		byName := map[string]object{}
		for _, o := range objects {
			kinds[o.Kind]++
			byName[o.Kind+"/"+o.Metadata.Name] = o
		}
		require.Equal(t, map[string]int{"Deployment": 2, "Service": 2, "Ingress": 1, "Job": 1, "PodDisruptionBudget": 2, "ServiceMonitor": 1}, kinds)
		require.NotContains(t, kinds, "Secret", "the chart never holds a secret")

		api, worker := byName["Deployment/rel-tally-api"], byName["Deployment/rel-tally-worker"]
		require.Equal(t, "Deployment", api.Kind)
		require.Equal(t, "worker", worker.Spec.Template.Metadata.Labels["app.kubernetes.io/component"])
		apiEnv, workerEnv := env(t, api), env(t, worker)
		for _, e := range []map[string]envVar{apiEnv, workerEnv} {
			require.Equal(t, "day", *e["TALLY_PERIOD"].Value)
		}
		require.Equal(t, "api", *apiEnv["TALLY_ROLES"].Value)
		require.Equal(t, "worker", *workerEnv["TALLY_ROLES"].Value)
		for _, c := range worker.Spec.Template.Spec.Containers {
			for _, p := range c.Ports {
				require.NotEqual(t, "http", p.Name, "a worker serves no API")
			}
		}

		// The ingress reaches the API's Service only, and that Service
		// selects the API's pods only.
		ing := byName["Ingress/rel-tally-api"]
		require.NotEmpty(t, ing.Spec.Rules)
		for _, rule := range ing.Spec.Rules {
			for _, p := range rule.HTTP.Paths {
				require.Equal(t, "rel-tally-api", p.Backend.Service.Name)
			}
		}
		svc := byName["Service/rel-tally-api"]
		require.Equal(t, "api", svc.Spec.Selector.(map[string]any)["app.kubernetes.io/component"])
		require.NotContains(t, text, "sk_live_")
		require.NotContains(t, text, "whsec_")
		require.NotContains(t, text, "postgres://")
	})

	// What the README links on the API's host: the API, its OpenAPI
	// document, River's UI and its login link. Nothing else: not /metrics,
	// not the probes.
	t.Run("IngressRoutesWhatTheReadmeLinks", func(t *testing.T) {
		objects, _ := render(t, helm, "--set", "ingress.enabled=true")
		var ing object
		for _, o := range objects {
			if o.Kind == "Ingress" {
				ing = o
			}
		}
		for _, path := range []string{"/v1/usage-events", "/v1/charges/1/resolve", "/openapi.yaml",
			"/riverui/", "/riverui/login", "/riverui/jobs", "/riverui/api/jobs"} {
			require.Equal(t, "rel-tally-api", ing.routes(path), "the ingress routes %s to the API", path)
		}
		for _, path := range []string{"/metrics", "/healthz", "/readyz", "/", "/openapi.yaml.bak", "/v10", "/riveruix"} {
			require.Empty(t, ing.routes(path), "the ingress does not route %s", path)
		}

		objects, _ = render(t, helm, "--set", "ingress.enabled=true", "--set", "ingress.riverUI=false")
		for _, o := range objects {
			if o.Kind == "Ingress" {
				require.Empty(t, o.routes("/riverui/jobs"), "ingress.riverUI=false keeps River's UI off the ingress")
				require.Equal(t, "rel-tally-api", o.routes("/openapi.yaml"))
			}
		}
	})

	// Each pod gets the secrets it uses: only workers call Stripe, only the
	// API verifies Stripe's webhooks.
	t.Run("SecretsWhereUsed", func(t *testing.T) {
		objects, _ := render(t, helm)
		for _, o := range objects {
			if o.Kind != "Deployment" {
				continue
			}
			e := env(t, o)
			var want, never []string
			switch *e["TALLY_ROLES"].Value {
			case "api":
				want, never = []string{"DATABASE_URL", "STRIPE_WEBHOOK_SECRET", "TALLY_METRICS_TOKEN"}, []string{"STRIPE_API_KEY"}
			case "worker":
				want, never = []string{"DATABASE_URL", "STRIPE_API_KEY", "TALLY_METRICS_TOKEN"}, []string{"STRIPE_WEBHOOK_SECRET"}
			default:
				require.FailNow(t, "unexpected roles", "%s: %s", o.Metadata.Name, *e["TALLY_ROLES"].Value)
			}
			for _, name := range want {
				require.NotNil(t, e[name].SecretRef, "%s of %s comes from a Secret", name, o.Metadata.Name)
			}
			for _, name := range never {
				require.NotContains(t, e, name, "%s gets no %s", o.Metadata.Name, name)
			}
		}

		// The API's pods can do without the key because the API never
		// calls Stripe: its actions on charges (resolve's refunds, retry's
		// cancel) schedule jobs the workers run.
		out, err := exec.Command("go", "list", "-deps", "github.com/tally-billing/tally/internal/api").CombinedOutput()
		require.NoError(t, err, "go list:\n%s", out)
		require.NotContains(t, string(out), "github.com/tally-billing/tally/internal/stripeapi\n",
			"internal/api calls Stripe: its pods would need STRIPE_API_KEY")
	})

	// A pooler is optional: unnamed, no pod gets TALLY_POOLER_URL; named,
	// both deployments get it from its Secret, and the migration job (which
	// takes an advisory lock for its session) does not.
	t.Run("PoolerURLOptional", func(t *testing.T) {
		objects, _ := render(t, helm)
		for _, o := range objects {
			require.NotContains(t, env(t, o), "TALLY_POOLER_URL", o.Metadata.Name)
		}
		objects, _ = render(t, helm, "--set", "secrets.poolerURL.name=tally-pooler", "--set", "secrets.poolerURL.key=url",
			"--set", "migrations.enabled=true")
		deployments := 0
		for _, o := range objects {
			e := env(t, o)
			switch o.Kind {
			case "Deployment":
				deployments++
				require.Equal(t, &secretRef{Name: "tally-pooler", Key: "url"}, e["TALLY_POOLER_URL"].SecretRef, o.Metadata.Name)
			default:
				require.NotContains(t, e, "TALLY_POOLER_URL", o.Metadata.Name)
			}
		}
		require.Equal(t, 2, deployments)
	})

	// Every pod's metrics port binds every interface, so it carries the
	// token (the server then requires it), and the ServiceMonitor sends the
	// same token.
	t.Run("MetricsBehindToken", func(t *testing.T) {
		objects, _ := render(t, helm, "--set", "metrics.serviceMonitor.enabled=true",
			"--set", "secrets.metricsToken.name=tally-metrics", "--set", "secrets.metricsToken.key=token")
		want := secretRef{Name: "tally-metrics", Key: "token"}
		monitors := 0
		for _, o := range objects {
			switch o.Kind {
			case "Deployment":
				e := env(t, o)
				addr := e["TALLY_METRICS_ADDR"].Value
				require.NotNil(t, addr, o.Metadata.Name)
				if strings.HasPrefix(*addr, "127.0.0.1:") || *addr == "off" {
					continue
				}
				require.Equal(t, &want, e["TALLY_METRICS_TOKEN"].SecretRef, "%s serves metrics on %s: with the token", o.Metadata.Name, *addr)
			case "ServiceMonitor":
				monitors++
				require.NotEmpty(t, o.Spec.Endpoints)
				for _, ep := range o.Spec.Endpoints {
					require.Equal(t, "Bearer", ep.Authorization.Type, "endpoint %s", ep.Port)
					require.Equal(t, want, ep.Authorization.Credentials, "endpoint %s sends the pods' token", ep.Port)
				}
			}
		}
		require.Equal(t, 1, monitors)
	})

	t.Run("SecretNamesRequired", func(t *testing.T) {
		for _, secret := range []string{"databaseURL", "stripeAPIKey", "stripeWebhookSecret", "metricsToken"} {
			out, err := exec.Command(helm, "template", "rel", "tally", "--set", "secrets."+secret+".name=").CombinedOutput()
			require.Error(t, err, secret)
			require.Contains(t, string(out), "secrets."+secret+".name is required")
		}
	})
}
