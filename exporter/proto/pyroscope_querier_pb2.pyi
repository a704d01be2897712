from exporter.proto import profile_pb2 as _profile_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SelectMergeProfileRequest(_message.Message):
    __slots__ = ("profile_typeID", "label_selector", "start", "end", "max_nodes", "stack_trace_selector", "profile_id_selector", "trace_id_selector")
    PROFILE_TYPEID_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    STACK_TRACE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    profile_typeID: str
    label_selector: str
    start: int
    end: int
    max_nodes: int
    stack_trace_selector: StackTraceSelector
    profile_id_selector: _containers.RepeatedScalarFieldContainer[str]
    trace_id_selector: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, profile_typeID: _Optional[str] = ..., label_selector: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., max_nodes: _Optional[int] = ..., stack_trace_selector: _Optional[_Union[StackTraceSelector, _Mapping]] = ..., profile_id_selector: _Optional[_Iterable[str]] = ..., trace_id_selector: _Optional[_Iterable[str]] = ...) -> None: ...

class StackTraceSelector(_message.Message):
    __slots__ = ("call_site", "go_pgo")
    CALL_SITE_FIELD_NUMBER: _ClassVar[int]
    GO_PGO_FIELD_NUMBER: _ClassVar[int]
    call_site: _containers.RepeatedCompositeFieldContainer[Location]
    go_pgo: GoPGO
    def __init__(self, call_site: _Optional[_Iterable[_Union[Location, _Mapping]]] = ..., go_pgo: _Optional[_Union[GoPGO, _Mapping]] = ...) -> None: ...

class Location(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GoPGO(_message.Message):
    __slots__ = ("keep_locations", "aggregate_callees")
    KEEP_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_CALLEES_FIELD_NUMBER: _ClassVar[int]
    keep_locations: int
    aggregate_callees: bool
    def __init__(self, keep_locations: _Optional[int] = ..., aggregate_callees: _Optional[bool] = ...) -> None: ...
