"""The format of a declarative provider file, as pydantic models: what ``providers add`` accepts
and what ``providers schema`` publishes as a JSON Schema. Only the shape is checked here; what
the fields mean together (templates naming declared fields, a parent table declared before its
children) is checked by ``connectors.declarative.checks``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
"""A provider, table or field name: lower case letters, digits and underscores."""
Path = Annotated[str, Field(min_length=1, pattern=r"^[^\s.][^\s]*$")]
"""A dotted path into a JSON body or record (``data``, ``meta.next``)."""
HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")]
Status = Annotated[int, Field(ge=100, le=599)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldSpec(_Strict):
    """A field of the connection's config or credentials."""

    type: Literal["string", "integer", "number", "boolean", "array"] = "string"
    description: str | None = None
    default: Any = None
    required: bool | None = Field(
        default=None, description="Default: required unless a default is given."
    )
    items: Literal["string", "integer"] = Field(
        default="string", description="For an array: the type of its items."
    )


class Bearer(_Strict):
    type: Literal["bearer"]
    token: str = Field(description='Template, e.g. "{credentials.token}".')


class Basic(_Strict):
    type: Literal["basic"]
    username: str
    password: str


class ApiKey(_Strict):
    type: Literal["api_key"]
    name: str = Field(description="The header or query parameter that carries the key.")
    value: str = Field(description='Template, e.g. "{credentials.api_key}".')
    in_: Literal["header", "query"] = Field(default="header", alias="in")


class OAuth2(_Strict):
    """OAuth2 tokens from the token endpoint: the credentials hold ``client_id`` and
    ``client_secret`` (and ``refresh_token`` for the refresh grant); the engine keeps the access
    token and saves refreshed ones."""

    type: Literal["oauth2"]
    token_url: str = Field(description="Template of config fields only.")
    grant: Literal["client_credentials", "refresh_token"] = "client_credentials"
    scope: str | None = None
    client_auth: Literal["client_secret_post", "client_secret_basic"] = "client_secret_post"


AuthSpec = Annotated[Bearer | Basic | ApiKey | OAuth2, Field(discriminator="type")]


class LinkHeader(_Strict):
    """``Link: <...>; rel="next"`` headers (RFC 8288)."""

    type: Literal["link_header"]


class NextUrl(_Strict):
    """The next page's URL in the body."""

    type: Literal["next_url"]
    path: Path = Field(description="Where the next URL is in the body, e.g. links.next.")


class Cursor(_Strict):
    """An opaque token in the body, sent back as a query parameter."""

    type: Literal["cursor"]
    path: Path = Field(description="Where the next token is in the body, e.g. next_cursor.")
    param: str = Field(default="cursor", description="The query parameter that carries it.")


class Offset(_Strict):
    """``?offset=0,100,200...``; stops at a short or empty page."""

    type: Literal["offset"]
    param: str = "offset"
    limit_param: str = "limit"
    limit: int = Field(default=100, ge=1)


class PageNumber(_Strict):
    """``?page=1,2,3...``; stops at a short or empty page, or at the count a header gives."""

    type: Literal["page_number"]
    param: str = "page"
    size_param: str = "per_page"
    size: int = Field(default=100, ge=1)
    first: int = Field(default=1, ge=0)
    total_header: str | None = Field(
        default=None, description="A header with the listing's record count, e.g. Total."
    )


class Single(_Strict):
    """One request, no paging."""

    type: Literal["none"]


PaginatorSpec = Annotated[
    LinkHeader | NextUrl | Cursor | Offset | PageNumber | Single, Field(discriminator="type")
]


class Incremental(_Strict):
    """What changed since the last sync, asked with a query parameter. The cursor is either
    the largest ``cursor_field`` value read, or the ``cursor_path`` value of the first page."""

    param: str = Field(description="The query parameter the cursor is sent as, e.g. since.")
    cursor_field: Path | None = Field(
        default=None, description="A record field: the largest value read is the next cursor."
    )
    cursor_path: Path | None = Field(
        default=None, description="A field of the first page's body that is the next cursor."
    )


class DeletedMarker(_Strict):
    """Records carrying this mark are deletions."""

    field: Path
    value: Any = Field(default=None, description="The value that marks it; default: any true.")


class DeletionFeed(_Strict):
    """An endpoint listing what was deleted since the table's cursor."""

    path: str
    records: Path | None = None
    id_field: Path | None = Field(
        default=None, description="The deleted record's key field; default: the primary key."
    )
    paginator: PaginatorSpec | None = None


class Confirm(_Strict):
    """One row by its key: a shifting table confirms each row missing from a listing with it."""

    path: str = Field(description="Template, e.g. /issues/{issues.number}.")
    gone: list[Status] = Field(default=[404, 410], min_length=1)


class TableSpec(_Strict):
    name: Name
    path: str = Field(description="Template: config fields, and a parent table's fields.")
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)
    records: Path | None = Field(
        default=None, description="Where the list of records is in the body; none: the body."
    )
    primary_key: Path | list[Path] = "id"
    paginator: PaginatorSpec | None = None
    incremental: Incremental | None = None
    deleted: DeletedMarker | None = None
    deletions: DeletionFeed | None = None
    hash_ignores: list[Path] = Field(default_factory=list)
    shifting: bool = False
    confirm: Confirm | None = None
    conditional: bool | None = Field(
        default=None, description="Ask with ETags; default: the provider's `conditional`."
    )


class RateLimit(_Strict):
    """The provider's rate-limit headers. Retry-After on a 429 or 503 is always honoured."""

    remaining_header: str | None = None
    reset_header: str | None = None
    reset: Literal["epoch", "seconds"] = Field(
        default="epoch", description="The reset header is a Unix time, or seconds from now."
    )
    retry_after_header: str = "Retry-After"
    statuses: list[Status] = Field(
        default=[429], description="Statuses that mean rate limited, whatever the headers."
    )
    budget_key: str | None = Field(
        default=None,
        description="Template: connections that fill it alike share one rate budget.",
    )


class Retry(_Strict):
    statuses: list[Status] = Field(
        description="Statuses retried (in the request, then by the next attempt); other 5xx "
        "are permanent."
    )


class ProviderSpec(_Strict):
    """A declarative provider: one REST API, described."""

    provider: Name
    description: str | None = None
    config: dict[Name, FieldSpec] = Field(default_factory=dict)
    credentials: dict[Name, FieldSpec] = Field(default_factory=dict)
    base_url: str = Field(description='Template of config fields: "{config.base_url}".')
    headers: dict[HeaderName, str] = Field(default_factory=dict)
    auth: AuthSpec | None = None
    paginator: PaginatorSpec | None = None
    rate_limit: RateLimit | None = None
    retry: Retry | None = None
    conditional: bool = Field(default=False, description="Ask complete listings with ETags.")
    tables: list[TableSpec] = Field(min_length=1)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a provider file, for editors."""
    schema = ProviderSpec.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "connector-sync declarative provider"
    return schema
