"""Run by tests/integration/test_instructor.py with instructor's own interpreter (.venv-instructor): instructor in
Mode.JSON_SCHEMA with a plain pydantic model (its schema has no ``additionalProperties: false``) asks the server at
``argv[1]`` (model ``argv[2]``) for a city, and prints what it parsed and the answer's own keys, as JSON."""

import json
import sys

import instructor
import openai
from pydantic import BaseModel


class City(BaseModel):
    name: str
    country: str


client = instructor.from_openai(openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120),
                                mode=instructor.Mode.JSON_SCHEMA)
city, completion = client.chat.completions.create_with_completion(
    model=sys.argv[2], response_model=City, max_retries=0, max_tokens=128, temperature=0,
    messages=[{"role": "user", "content": "Describe Tokyo in detail, as JSON."}])
print(json.dumps({"parsed": city.model_dump(), "keys": sorted(json.loads(completion.choices[0].message.content))}))
