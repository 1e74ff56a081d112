package binding

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// etcdRecord is a record's value in etcd.
type etcdRecord struct {
	Schema int `json:"schema"`
	fileRecord
}

func encodeEtcd(r Record) (string, error) {
	if err := checkGenerationPtr(r.KeyGeneration); err != nil {
		return "", err
	}
	data, err := json.Marshal(etcdRecord{Schema: etcdSchema, fileRecord: fileRecord(r)})
	return string(data), err
}

// checkGenerationPtr is checkGeneration for a record's optional field.
func checkGenerationPtr(gen *uint32) error {
	if gen == nil {
		return nil
	}
	return checkGeneration(*gen)
}

// decodeEtcd checks and decodes the value of key: at most 4 KiB, schema
// 1, no unknown field, a valid record, and one that names key itself (a
// record copied to another key is refused).
func (e *Etcd) decodeEtcd(key string, value []byte) (Record, error) {
	if len(value) > maxRecordFile {
		return Record{}, fmt.Errorf("binding: etcd record %s is over %d bytes", key, maxRecordFile)
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	var er etcdRecord
	if err := dec.Decode(&er); err != nil {
		return Record{}, fmt.Errorf("binding: etcd record %s: %w", key, err)
	}
	if dec.More() {
		return Record{}, fmt.Errorf("binding: etcd record %s: data after the record", key)
	}
	if er.Schema != etcdSchema {
		return Record{}, fmt.Errorf("binding: etcd record %s has schema %d, not %d", key, er.Schema, etcdSchema)
	}
	r := Record(er.fileRecord)
	switch {
	case checkGenerationPtr(r.KeyGeneration) != nil:
		// Before validRecord, which refuses it too, so the reason is named.
		return Record{}, fmt.Errorf("binding: etcd record %s: key generation %d is over %d", key, *r.KeyGeneration, MaxGeneration)
	case !validRecord(r) || r.Created.IsZero():
		return Record{}, fmt.Errorf("binding: etcd record %s is not a valid record", key)
	case e.Key(r.Kind, r.Name) != key:
		return Record{}, fmt.Errorf("binding: etcd record %s does not name itself", key)
	}
	return r, nil
}
