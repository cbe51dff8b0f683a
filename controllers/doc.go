// Package controllers holds the operator's reconcilers for the
// streams.catena.io API (api/v1alpha1). Each decides in pure, table-tested
// functions and acts thinly; see ../shared/STYLE.md. Its kubebuilder RBAC
// markers feed `make manifests`.
package controllers
