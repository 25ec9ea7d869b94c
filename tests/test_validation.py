"""describe_errors: the one line every boundary makes of a pydantic ValidationError."""
import pytest
from pydantic import BaseModel, ValidationError, field_validator, model_validator

from seis.validation import describe_errors


class _Settings(BaseModel):
    chains: int
    device: str = "cpu"

    @field_validator("device")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {v!r}")
        return v

    @model_validator(mode="after")
    def _cuda_needs_chains(self) -> "_Settings":
        if self.device == "cuda" and self.chains < 1:
            raise ValueError("cuda needs at least one chain")
        return self


def _error(**values) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        _Settings(**values)
    return e.value


def test_each_error_follows_the_name_the_user_typed():
    text = describe_errors(_error(chains="many", device="tpu"), lambda f: f"--{f}")
    assert text.startswith("--chains: ") and "; --device: device must be cpu or cuda" in text
    assert "Value error" not in text


def test_the_input_is_named_once_even_where_the_message_names_it():
    text = describe_errors(_error(chains="many", device="tpu"), with_input=True)
    assert "got 'many'" in text
    assert text.count("got 'tpu'") == 1


def test_a_cross_field_error_is_its_message_alone():
    for with_input in (False, True):  # the whole input would say nothing the message does not
        assert describe_errors(_error(chains=0, device="cuda"), lambda f: f"--{f}",
                               with_input=with_input) == "cuda needs at least one chain"
