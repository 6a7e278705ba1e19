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

package datamover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// AnnotationCleanedUp marks a finished DataUpload or DataDownload whose
// temporary objects are gone.
const AnnotationCleanedUp = "kubevirt-datamover.io/cleaned-up"

// CacheOptions restrict the manager's pod cache to the controllers' pods
// and, when namespace is set, the pods and Velero's objects to Velero's
// namespace, where the pods run.
func CacheOptions(namespace string) cache.Options {
	req, _ := labels.NewRequirement(LabelOwnerKind, selection.Exists, nil)
	pods := cache.ByObject{Label: labels.NewSelector().Add(*req)}
	if namespace != "" {
		pods.Namespaces = map[string]cache.Config{namespace: {}}
	}
	by := map[client.Object]cache.ByObject{&corev1.Pod{}: pods}
	if namespace != "" {
		only := map[string]cache.Config{namespace: {}}
		by[&velerov2.DataUpload{}] = cache.ByObject{Namespaces: only}
		by[&velerov2.DataDownload{}] = cache.ByObject{Namespaces: only}
		by[&velerov1.BackupStorageLocation{}] = cache.ByObject{Namespaces: only}
	}
	return cache.Options{ByObject: by}
}

// errWait is a condition the controller waits out, reported in the status
// message rather than as a failure.
type errWait struct {
	reason, message string
	after           time.Duration
}

func (e *errWait) Error() string { return e.message }

func waitFor(reason string, after time.Duration, format string, args ...any) error {
	return &errWait{reason: reason, message: fmt.Sprintf(format, args...), after: after}
}

// errFatal ends the operation as Failed: what it says cannot change on a
// retry (what the user named does not exist, the input is invalid). Every
// other error is returned to the work queue, which retries with backoff.
type errFatal struct{ err error }

func (e *errFatal) Error() string { return e.err.Error() }

func (e *errFatal) Unwrap() error { return e.err }

// fatal formats like fmt.Errorf, %w keeping the cause.
func fatal(format string, args ...any) error { return &errFatal{err: fmt.Errorf(format, args...)} }

// isFatal reports whether err ends the operation; its whole text is then
// the status message.
func isFatal(err error) bool {
	var fat *errFatal
	return errors.As(err, &fat)
}

// apiFailure wraps the failure of a request to the API server. A request
// the server refuses as invalid (a bad storage class name, a pod spec it
// rejects) fails the operation; anything else — a conflict, a timeout,
// throttling, an unavailable server or webhook — is retried with backoff.
func apiFailure(err error, format string, args ...any) error {
	wrapped := fmt.Errorf(format+": %w", append(args, err)...)
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return &errFatal{err: wrapped}
	}
	return wrapped
}

// getLatest reads an object through the controller's cache and, when the
// cache lacks it, from the API server: an object this controller created a
// moment ago may not have reached the cache yet (its watch and the owner's
// are not ordered), so only the API server's NotFound means it is gone.
func getLatest(ctx context.Context, cached client.Client, api client.Reader, key client.ObjectKey, obj client.Object) error {
	err := cached.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return api.Get(ctx, key, obj)
	}
	return err
}

// availableLocation finds the named location and requires it Available;
// a location the API server does not have is fatal, an unavailable one is
// waited for.
func availableLocation(ctx context.Context, cached client.Client, api client.Reader, namespace, name string, poll time.Duration) (*velerov1.BackupStorageLocation, error) {
	bsl := &velerov1.BackupStorageLocation{}
	if err := getLatest(ctx, cached, api, client.ObjectKey{Namespace: namespace, Name: name}, bsl); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fatal("backup storage location %s/%s not found", namespace, name)
		}
		return nil, fmt.Errorf("get backup storage location %s/%s: %w", namespace, name, err)
	}
	if bsl.Status.Phase != velerov1.BackupStorageLocationPhaseAvailable {
		phase := string(bsl.Status.Phase)
		if phase == "" {
			phase = "not validated yet"
		}
		msg := fmt.Sprintf("backup storage location %s is %s", name, phase)
		if bsl.Status.Message != "" {
			msg += ": " + bsl.Status.Message
		}
		return nil, waitFor("BackupStorageLocationUnavailable", poll, "waiting: %s", msg)
	}
	return bsl, nil
}

// deleteIfPresent deletes an object; gone or going is success.
func deleteIfPresent(ctx context.Context, c client.Client, obj client.Object) error {
	err := c.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// deleteAll deletes every object and reports every failure.
func deleteAll(ctx context.Context, c client.Client, objs ...client.Object) error {
	var errs []error
	for _, o := range objs {
		if err := deleteIfPresent(ctx, c, o); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ownerRequests maps an object the controller created to its owner.
func ownerRequests(kind string) func(context.Context, client.Object) []reconcile.Request {
	return func(_ context.Context, o client.Object) []reconcile.Request {
		key, ok := ownerOf(o.GetLabels(), o.GetAnnotations(), kind)
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: key}}
	}
}

// deadline is when an operation created at start with timeout times out.
func deadline(created metav1.Time, timeout metav1.Duration, def time.Duration) (time.Time, time.Duration) {
	d := timeout.Duration
	if d <= 0 {
		d = def
	}
	return created.Add(d), d
}

// firstLine shortens a pod's message for a status.
func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	const limit = 1024
	if len(s) > limit {
		s = s[:limit] + "…"
	}
	return s
}

func nn(namespace, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: name}
}
