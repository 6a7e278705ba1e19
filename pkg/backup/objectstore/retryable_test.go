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

package objectstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

var _ = DescribeTable("Retryable tells which failed transfers may pass when started again",
	func(err error, retryable bool) {
		Expect(objectstore.Retryable(fmt.Errorf("s3: put k: %w", err))).To(Equal(retryable))
	},
	Entry("403 Forbidden", minio.ErrorResponse{StatusCode: http.StatusForbidden, Code: "AccessDenied"}, false),
	Entry("400 Bad Request", minio.ErrorResponse{StatusCode: http.StatusBadRequest}, false),
	Entry("not found", objectstore.ErrNotFound, false),
	Entry("precondition failed", objectstore.ErrPreconditionFailed, false),
	Entry("the context ended", context.Canceled, false),
	Entry("408 Request Timeout", minio.ErrorResponse{StatusCode: http.StatusRequestTimeout}, true),
	Entry("429 Too Many Requests", minio.ErrorResponse{StatusCode: http.StatusTooManyRequests}, true),
	Entry("503 Slow Down", minio.ErrorResponse{StatusCode: http.StatusServiceUnavailable, Code: "SlowDown"}, true),
	Entry("a broken connection", errors.New("connection reset by peer"), true),
	Entry("a torn read", objectstore.ErrTornRead, true),
)
