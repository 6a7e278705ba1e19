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

// Package backup_test is the functional suite of the backup data path: a
// real S3 server (versitygw) on loopback and, for the hypervisor side,
// libvirt's checkpoints and push-mode backups of a running guest.
package backup_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestBackup(t *testing.T) {
	framework.RunSuite(t, "backup functional Suite")
}

var s3Binary string

var _ = BeforeSuite(func(ctx context.Context) {
	var err error
	s3Binary, err = s3server.Binary(ctx, testenv.RepoRoot())
	framework.Require(err, "the S3 server build (hack/s3-server.sh)")
}, NodeTimeout(15*60e9))

// startS3 runs a fresh S3 server for one spec, stopped when the spec ends.
func startS3(ctx context.Context) *s3server.Server {
	srv, err := s3server.Start(ctx, s3Binary, GinkgoT().TempDir())
	framework.Require(err, "the S3 server (versitygw)")
	DeferCleanup(srv.Stop)
	return srv
}
