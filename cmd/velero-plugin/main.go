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

// Command velero-plugin is the kubevirt data mover's Velero plugin: the
// actions of package veleroplugin, served to Velero's server through its
// plugin framework. Velero runs it from its plugins directory; its image
// copies it there with
//
//	velero-plugin install DIR
//
// (the init container `velero plugin add` makes mounts the directory at
// /target). The actions reach the API server with the in-cluster
// configuration of Velero's pod, or $KUBECONFIG.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"
	"github.com/vmware-tanzu/velero/pkg/plugin/framework"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging/logrusr"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/veleroplugin"
)

// InstalledName is the plugin's file name in Velero's plugins directory,
// which every plugin image shares.
const InstalledName = "kubevirt-qcow2-velero-plugin"

func main() {
	// Velero runs a plugin with its server's flags, which all start with
	// "--": a first word of "install" is never Velero's.
	if len(os.Args) > 1 && os.Args[1] == "install" {
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: velero-plugin install DIR")
			os.Exit(2)
		}
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "velero-plugin: %v\n", err)
			os.Exit(1)
		}
		return
	}
	var c lazyClient
	framework.NewServer().
		BindFlags(pflag.CommandLine).
		RegisterBackupItemActionV2(veleroplugin.BackupActionName, func(log logrus.FieldLogger) (any, error) {
			cl, err := c.get(log)
			if err != nil {
				return nil, err
			}
			return veleroplugin.NewBackupAction(cl, log), nil
		}).
		RegisterRestoreItemActionV2(veleroplugin.RestoreActionName, func(log logrus.FieldLogger) (any, error) {
			cl, err := c.get(log)
			if err != nil {
				return nil, err
			}
			return veleroplugin.NewRestoreAction(cl, log), nil
		}).
		RegisterBackupItemActionV2(veleroplugin.ClaimBackupActionName, func(log logrus.FieldLogger) (any, error) {
			cl, err := c.get(log)
			if err != nil {
				return nil, err
			}
			return veleroplugin.NewClaimBackupAction(cl, log), nil
		}).
		RegisterRestoreItemActionV2(veleroplugin.ClaimRestoreActionName, func(log logrus.FieldLogger) (any, error) {
			return veleroplugin.NewClaimRestoreAction(log), nil
		}).
		RegisterRestoreItemActionV2(veleroplugin.OwnedRestoreActionName, func(log logrus.FieldLogger) (any, error) {
			return veleroplugin.NewOwnedRestoreAction(log), nil
		}).
		RegisterDeleteItemAction(veleroplugin.DeleteActionName, func(log logrus.FieldLogger) (any, error) {
			cl, err := c.get(log)
			if err != nil {
				return nil, err
			}
			return veleroplugin.NewDeleteAction(cl, log), nil
		}).
		Serve()
}

// lazyClient is the actions' client, made when Velero first asks for an
// action: listing the plugins needs none. The first action's logger is the
// plugin server's, which Velero's log receives: it becomes the logger of
// controller-runtime and klog, through which the client logs, before the
// client exists.
type lazyClient struct {
	once sync.Once
	c    client.Client
	err  error
}

func (l *lazyClient) get(log logrus.FieldLogger) (client.Client, error) {
	l.once.Do(func() {
		logging.Setup(context.Background(), logrusr.New(log))
		cfg, err := config.GetConfig()
		if err != nil {
			l.err = fmt.Errorf("kubernetes client configuration: %w", err)
			return
		}
		scheme, err := datamover.NewScheme()
		if err != nil {
			l.err = err
			return
		}
		if l.c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
			l.err = fmt.Errorf("kubernetes client: %w", err)
		}
	})
	return l.c, l.err
}

// install copies this executable into dir as InstalledName, through a
// temporary file renamed into place so that Velero never runs half of it.
func install(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this executable: %w", err)
	}
	src, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, "."+InstalledName+"-*")
	if err != nil {
		return fmt.Errorf("install into %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return fmt.Errorf("install into %s: %w", dir, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("install into %s: %w", dir, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install into %s: %w", dir, err)
	}
	dst := filepath.Join(dir, InstalledName)
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("install into %s: %w", dir, err)
	}
	fmt.Printf("installed %s\n", dst)
	return nil
}
