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

// Command datamover-upload runs in the pods of the KubeVirt data mover:
// "upload" stores the qcow2 files of a VirtualMachineBackup in the backup
// storage location, "restore" rebuilds a disk from a backup onto a volume.
// It reports its result in the termination message, and its progress in the
// DataUpload's or DataDownload's status when the pod has an API token.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

const (
	// defaultTerminationLog is where Kubernetes reads a container's
	// termination message unless its terminationMessagePath says
	// otherwise; $DATAMOVER_TERMINATION_LOG moves it, for a run outside
	// a pod (a benchmark) that must not create it in the host's /dev.
	defaultTerminationLog = "/dev/termination-log"
	envTerminationLog     = "DATAMOVER_TERMINATION_LOG"
	progressInterval      = 5 * time.Second
)

func main() {
	log, err := logging.New(logging.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "datamover-upload: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx = logging.Setup(ctx, log)
	msg, err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		msg = err.Error()
	}
	fmt.Println(msg)
	terminationLog := defaultTerminationLog
	if p := os.Getenv(envTerminationLog); p != "" {
		terminationLog = p
	}
	if werr := os.WriteFile(terminationLog, []byte(msg), 0o644); werr != nil && !errors.Is(werr, os.ErrNotExist) {
		log.Error(werr, "write the termination message", "file", terminationLog)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "datamover-upload: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("usage: datamover-upload upload|restore [flags]")
	}
	switch args[0] {
	case mover.CommandUpload:
		o, err := mover.ParseUpload(args[1:], os.Getenv)
		if err != nil {
			return "", err
		}
		repo, err := mover.Repository(o.BSL, o.Credentials)
		if err != nil {
			return "", err
		}
		res, err := mover.Upload(ctx, repo, o, progress(ctx, o.Progress, &velerov2.DataUpload{}, progressInterval))
		if err != nil {
			return "", err
		}
		return mover.EncodeResult(res)
	case mover.CommandRestore:
		o, err := mover.ParseRestore(args[1:], os.Getenv)
		if err != nil {
			return "", err
		}
		repo, err := mover.Repository(o.BSL, o.Credentials)
		if err != nil {
			return "", err
		}
		res, err := mover.Restore(ctx, repo, o, progress(ctx, o.Progress, &velerov2.DataDownload{}, progressInterval))
		if err != nil {
			return "", err
		}
		return mover.EncodeResult(res)
	default:
		return "", fmt.Errorf("unknown command %q: want upload or restore", args[0])
	}
}

// progress patches the owner's status when the pod may; otherwise progress
// is only in the final result.
func progress(ctx context.Context, ref mover.ObjectRef, obj client.Object, interval time.Duration) mover.ProgressFunc {
	if ref.Name == "" {
		return nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil
	}
	scheme, err := datamover.NewScheme()
	if err != nil {
		return nil
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "no progress reports")
		return nil
	}
	obj.SetNamespace(ref.Namespace)
	obj.SetName(ref.Name)
	r := &mover.StatusReporter{Client: c, Object: obj, Interval: interval}
	return r.Func(ctx)
}
