/*
This file is part of the kubevirt-qcow2 project

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

Copyright The kubevirt-qcow2 Authors.
*/

// Command datamover-controller runs the KubeVirt data mover's DataUpload and
// DataDownload controllers for Velero.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "datamover-controller: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		cfg         datamover.Config
		namespace   string
		metrics     string
		probes      string
		leaderElect bool
		pullPolicy  string
		resources   datamover.PodResources
		placement   struct{ nodeSelector, tolerations, groups string }
	)
	hostname, _ := os.Hostname()
	flag.StringVar(&namespace, "namespace", "velero", "Velero's namespace (DataUploads, DataDownloads, locations); empty for all")
	flag.StringVar(&cfg.Identity, "identity", envOr("POD_NAME", hostname), "name reported in status.acceptedByNode")
	flag.StringVar(&cfg.Image, "image", "", "image of the upload and restore pods (holds datamover-upload)")
	flag.StringVar(&cfg.Command, "command", "/usr/bin/datamover-upload", "datamover-upload's path in the image")
	flag.StringVar(&pullPolicy, "image-pull-policy", string(corev1.PullIfNotPresent), "pull policy of the pods' image")
	flag.StringVar(&cfg.PodServiceAccount, "pod-service-account", "", "service account of the pods in Velero's namespace, where they run (enables progress reports)")
	flag.DurationVar(&cfg.DefaultTimeout, "default-timeout", 4*time.Hour, "timeout when spec.operationTimeout is zero")
	flag.IntVar(&cfg.MaxChainLength, "max-chain-length", 0, "most layers of a chain, the full base included; 0 for no cap")
	flag.IntVar(&cfg.MaxVMBackups, "concurrent-vm-backups", 0, "most VirtualMachineBackups of DataUploads running at once, cluster-wide; 0 for no limit")
	flag.IntVar(&cfg.MaxUploads, "concurrent-vm-datauploads", 0, "most upload pods running at once; 0 for no limit")
	flag.StringVar(&cfg.StorageClass, "storage-class", "", "storage class of the temporary volumes; empty for the default")
	flag.StringVar(&resources.CPURequest, "pod-cpu-request", "", "CPU request of the upload and restore pods (e.g. 500m); empty for none")
	flag.StringVar(&resources.MemoryRequest, "pod-memory-request", "", "memory request of the pods (e.g. 256Mi); empty for none")
	flag.StringVar(&resources.CPULimit, "pod-cpu-limit", "", "CPU limit of the pods; empty for none")
	flag.StringVar(&resources.MemoryLimit, "pod-memory-limit", "", "memory limit of the pods; empty for none")
	flag.StringVar(&placement.nodeSelector, "pod-node-selector", "", "node selector of the pods: key=value[,key=value...]")
	flag.StringVar(&placement.tolerations, "pod-tolerations", "", "tolerations of the pods: key[=value][:effect][,...]")
	flag.StringVar(&cfg.WebIdentityAudience, "web-identity-audience", datamover.DefaultWebIdentityAudience,
		"audience of the service account token the pods are given where a location's credentials name a web_identity_token_file (EKS: sts.amazonaws.com)")
	flag.StringVar(&placement.groups, "pod-supplemental-groups", "", "supplemental groups of the pods' user (107): gid[,gid...], e.g. the nodes' block device group")
	flag.StringVar(&metrics, "metrics-bind-address", ":8080", "metrics endpoint; 0 to disable")
	flag.StringVar(&probes, "health-probe-bind-address", ":8081", "health probe endpoint; 0 to disable")
	flag.BoolVar(&leaderElect, "leader-elect", false, "elect a leader among replicas")
	var logOpts logging.Options
	logOpts.AddFlags(flag.CommandLine)
	flag.Parse()
	log, err := logging.New(logOpts)
	if err != nil {
		return err
	}
	ctx := logging.Setup(ctrl.SetupSignalHandler(), log)
	if cfg.Image == "" {
		return fmt.Errorf("-image is required")
	}
	cfg.ImagePullPolicy = corev1.PullPolicy(pullPolicy)
	if cfg.PodResources, err = resources.Requirements(); err != nil {
		return fmt.Errorf("-pod-*: %w", err)
	}
	if cfg.PodNodeSelector, err = datamover.ParseNodeSelector(placement.nodeSelector); err != nil {
		return fmt.Errorf("-pod-node-selector: %w", err)
	}
	if cfg.PodTolerations, err = datamover.ParseTolerations(placement.tolerations); err != nil {
		return fmt.Errorf("-pod-tolerations: %w", err)
	}
	if cfg.PodSupplementalGroups, err = datamover.ParseGroups(placement.groups); err != nil {
		return fmt.Errorf("-pod-supplemental-groups: %w", err)
	}

	scheme, err := datamover.NewScheme()
	if err != nil {
		return err
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   datamover.CacheOptions(namespace),
		Metrics:                 metricsserver.Options{BindAddress: metrics},
		HealthProbeBindAddress:  probes,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "kubevirt-datamover-controller",
		LeaderElectionNamespace: namespace,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if err := datamover.Setup(ctx, mgr, cfg); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("health check: %w", err)
	}
	return mgr.Start(ctx)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
