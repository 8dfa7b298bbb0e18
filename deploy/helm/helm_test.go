// Package helm_test lints and renders Tally's Helm chart and checks what it
// renders: API and workers apart, secrets only by reference.
package helm_test

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/tally-billing/tally/internal/testtool"
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
				Paths []struct {
					Backend struct {
						Service struct {
							Name string `yaml:"name"`
						} `yaml:"service"`
					} `yaml:"backend"`
				} `yaml:"paths"`
			} `yaml:"http"`
		} `yaml:"rules"`
	} `yaml:"spec"`
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
		env := func(o object) map[string]string {
			m := map[string]string{}
			for _, c := range o.Spec.Template.Spec.Containers {
				for _, e := range c.Env {
					switch {
					case e.ValueFrom != nil:
						m[e.Name] = "secretKeyRef"
						require.Contains(t, e.ValueFrom, "secretKeyRef", "%s", e.Name)
						require.Nil(t, e.Value, "%s has a value and a reference", e.Name)
					case e.Value != nil:
						m[e.Name] = *e.Value
					}
				}
			}
			return m
		}
		for _, o := range []object{api, worker} {
			e := env(o)
			for _, secret := range []string{"DATABASE_URL", "STRIPE_API_KEY", "STRIPE_WEBHOOK_SECRET", "TALLY_METRICS_TOKEN"} {
				require.Equal(t, "secretKeyRef", e[secret], "%s of %s comes from a Secret", secret, o.Metadata.Name)
			}
			require.Equal(t, "day", e["TALLY_PERIOD"])
		}
		require.Equal(t, "api", env(api)["TALLY_ROLES"])
		require.Equal(t, "worker", env(worker)["TALLY_ROLES"])
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

	t.Run("SecretNamesRequired", func(t *testing.T) {
		out, err := exec.Command(helm, "template", "rel", "tally", "--set", "secrets.databaseURL.name=").CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "secrets.databaseURL.name is required")
	})
}
