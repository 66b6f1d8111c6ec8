package agentsandboxtest

import (
	"embed"
	"fmt"
	"path"
	"sync"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

//go:embed testdata/crds/*.yaml
var crdFiles embed.FS

// resource is one served custom resource: its names and its v1beta1 schema, compiled once.
type resource struct {
	gvr        schema.GroupVersionResource
	kind       string
	listKind   string
	singular   string
	shortNames []string
	structural *structuralschema.Structural
	validator  apiservervalidation.SchemaValidator
}

var (
	resourcesOnce sync.Once
	resourcesList []*resource
	resourcesErr  error
)

// resources parses the embedded CRDs (upstream's, see testdata/crds/README.md) into their served
// v1beta1 versions.
func resources() ([]*resource, error) {
	resourcesOnce.Do(func() {
		ents, err := crdFiles.ReadDir("testdata/crds")
		if err != nil {
			resourcesErr = err
			return
		}
		for _, e := range ents {
			b, err := crdFiles.ReadFile(path.Join("testdata/crds", e.Name()))
			if err != nil {
				resourcesErr = err
				return
			}
			r, err := compileCRD(b)
			if err != nil {
				resourcesErr = fmt.Errorf("%s: %w", e.Name(), err)
				return
			}
			resourcesList = append(resourcesList, r)
		}
	})
	return resourcesList, resourcesErr
}

func compileCRD(b []byte) (*resource, error) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		return nil, err
	}
	for _, v := range crd.Spec.Versions {
		if v.Name != "v1beta1" || !v.Served || v.Schema == nil {
			continue
		}
		var internal apiextensions.JSONSchemaProps
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
			return nil, err
		}
		s, err := structuralschema.NewStructural(&internal)
		if err != nil {
			return nil, err
		}
		val, _, err := apiservervalidation.NewSchemaValidator(&internal)
		if err != nil {
			return nil, err
		}
		return &resource{
			gvr:        schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural},
			kind:       crd.Spec.Names.Kind,
			listKind:   crd.Spec.Names.ListKind,
			singular:   crd.Spec.Names.Singular,
			shortNames: crd.Spec.Names.ShortNames,
			structural: s,
			validator:  val,
		}, nil
	}
	return nil, fmt.Errorf("CRD %s serves no v1beta1 schema", crd.Name)
}

// resourceFor returns the served resource of obj's apiVersion and kind.
func resourceFor(apiVersion, kind string) (*resource, error) {
	rs, err := resources()
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.gvr.GroupVersion().String() == apiVersion && r.kind == kind {
			return r, nil
		}
	}
	return nil, fmt.Errorf("no served resource %s %s", apiVersion, kind)
}

// Validate checks obj the way the API server does on a create with strict field validation
// (kubectl's default): it must be one of the four agent-sandbox kinds at v1beta1, a field
// unknown to the schema is an error, defaults are applied, and the result is validated against
// the CRD's OpenAPI schema (CEL rules, x-kubernetes-validations, are not evaluated). obj is
// modified in place (defaulted); a failure is a *apierrors.StatusError with reason Invalid (422)
// or BadRequest (an unknown kind or field).
func Validate(obj *unstructured.Unstructured) error {
	r, err := resourceFor(obj.GetAPIVersion(), obj.GetKind())
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	return r.validate(obj, true)
}

// validate prunes unknown fields (an error when strict), defaults and validates obj.
func (r *resource) validate(obj *unstructured.Unstructured, strict bool) error {
	unknown := structuralpruning.PruneWithOptions(obj.Object, r.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: strict})
	if len(unknown) > 0 {
		return apierrors.NewBadRequest(fmt.Sprintf("strict decoding error: unknown field %q", unknown[0]))
	}
	structuraldefaulting.Default(obj.Object, r.structural)
	var errs field.ErrorList
	name := obj.GetName()
	if name == "" && obj.GetGenerateName() == "" {
		errs = append(errs, field.Required(field.NewPath("metadata", "name"), "name or generateName is required"))
	}
	if name != "" {
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), name, msg))
		}
	}
	if lbl := obj.GetLabels(); lbl != nil {
		for k, v := range lbl {
			for _, msg := range validation.IsQualifiedName(k) {
				errs = append(errs, field.Invalid(field.NewPath("metadata", "labels"), k, msg))
			}
			for _, msg := range validation.IsValidLabelValue(v) {
				errs = append(errs, field.Invalid(field.NewPath("metadata", "labels"), v, msg))
			}
		}
	}
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj.UnstructuredContent(), r.validator)...)
	if len(errs) > 0 {
		return apierrors.NewInvalid(schema.GroupKind{Group: r.gvr.Group, Kind: r.kind}, name, errs)
	}
	return nil
}
